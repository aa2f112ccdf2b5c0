"""The hook's agreement, measured both ways side by side: a verdict packet through the switch
(one MAX cell per rank, what a bucket within a step costs now) against the process group's
MAX all_reduce of the `GlooVerdict` (what every bucket cost before, and what seals a step).

W ranks as threads of this process, each with its agent (its UDP socket in its host's
namespace, through the target's switch) and its own gloo process group over loopback (the
ranks' one host: gloo's best case). Rounds alternate the two ways; in a round every rank
starts each agreement together (a thread barrier) and times its own call. Prints the p50 and
p99 of those times per way and target, and writes bench/results/agreement.md. Beside it, in
this process: the switch round trips and process-group agreements of a step of `make run`'s
NCF (its three buckets: the user and item tables' sparse rows, the dense rest), before (the
lossless codec's exponents in a MAX phase, every bucket agreed over the process group) and
now (the exponents in the OR phase, a verdict packet, one agreement sealing the step).

    python -m bench.agreement [--world 4] [--rounds 10] [--per-round 50] [--targets refswitch ebpf]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import numpy as np

from bench.publish import publish

POOL_SIZE = 8
WAYS = ("switch verdict", "gloo all_reduce")
CELLS = 256  # per packet


def open_agents(c, job, world: int) -> list:
    """Every rank's agent, joined concurrently (WaitReady blocks until all joined)."""
    from homagg.lab.threads import run_threads
    from homagg.worker.job.agent import WorkerAgent

    def join(r: int) -> WorkerAgent:
        return WorkerAgent(c.agent_config(job, r), c.socket_factory(r))

    return run_threads([partial(join, r) for r in range(world)], 60)[1]


def open_gloo(world: int) -> list:
    """A gloo process group per rank (threads of this process, one in-memory store)."""
    import torch.distributed as dist

    from homagg.lab.threads import run_threads

    store = dist.HashStore()

    def make(r: int):
        prefixed = dist.PrefixStore("bench-agreement", store)
        return dist.ProcessGroupGloo(prefixed, r, world, timedelta(seconds=60))

    return run_threads([partial(make, r) for r in range(world)], 60)[1]


def switch_call(agent) -> None:
    """One verdict packet through the switch."""
    from homagg.wire.constants import Op
    from homagg.worker.ddp.agreement import OK, SwitchVerdict

    agent.transport.allreduce(Op.MAX, SwitchVerdict(OK).cells())


def gloo_call(pg) -> None:
    """One MAX all_reduce of a GlooVerdict through the process group."""
    import torch.distributed as dist

    from homagg.worker.ddp.agreement import OK, GlooVerdict

    t = GlooVerdict.local(0, OK, OK, OK, 0, 0).pack()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
    pg.allreduce([t], opts).wait()


def timed(calls: list, count: int) -> list[float]:
    """`count` agreements, every rank's call started together; every rank's seconds."""
    from homagg.lab.threads import run_threads

    barrier = threading.Barrier(len(calls), timeout=60)

    def rank(call) -> list[float]:
        times = []
        for _ in range(count):
            barrier.wait()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return times

    return [t for ts in run_threads([partial(rank, c) for c in calls], 600)[1] for t in ts]


def measure(target: str, world: int, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Both ways on one switch, alternating round by round; seconds per call per rank."""
    from homagg.lab.controlled import Controlled

    c = Controlled(Path(tempfile.mkdtemp(prefix="bench-agreement-")), world, True, target=target)
    agents: list = []
    try:
        job = c.create(world, pool_size=POOL_SIZE)
        agents = open_agents(c, job, world)
        groups = open_gloo(world)
        calls = {
            WAYS[0]: [partial(switch_call, a) for a in agents],
            WAYS[1]: [partial(gloo_call, g) for g in groups],
        }
        for way in WAYS:  # warm up: the first packets, gloo's connections
            timed(calls[way], 5)
        out: dict[str, list[float]] = {w: [] for w in WAYS}
        for i in range(rounds):
            for way in WAYS if i % 2 == 0 else WAYS[::-1]:
                out[way] += timed(calls[way], per_round)
        return out
    finally:
        for a in agents:
            a.close()
        c.close()


def ncf_buckets(world: int, seed: int = 0) -> list[list]:
    """Every rank's three buckets of a step of make run's NCF (run/model.py): the user and
    item tables' rows its batch touched (as SparseRows) and the dense rest (flat)."""
    from homagg.worker.codecs import SparseRows

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(world):
        tables = []
        for nrows in (20_000, 4_000):
            rows = np.unique(rng.integers(0, nrows, 64))
            tables.append(SparseRows(rows, rng.standard_normal((rows.size, 16), np.float32), nrows))
        out.append([*tables, rng.standard_normal(1_042).astype(np.float32)])
    return out


def round_trips(world: int, exponents: str) -> list[int]:
    """Switch round trips of each bucket's phases (a phase of more packets than the pool
    takes one per pool's worth), the lossless codec's exponents as `exponents` says."""
    from homagg.worker.codecs import LosslessSparse
    from homagg.worker.codecs.simulate import drive

    buckets, trips = ncf_buckets(world), []
    for b in range(3):
        log: list = []
        codecs = [LosslessSparse(world, exponents=exponents, support_block=16) for _ in buckets]
        drive(
            [
                c.aggregate_rows(x[b]) if b < 2 else c.aggregate(x[b])
                for c, x in zip(codecs, buckets, strict=True)
            ],
            phases_log=log,
        )
        packets = [-(-p.cells.size // CELLS) for p in log]  # the log has each phase once
        trips.append(sum(-(-n // POOL_SIZE) for n in packets))
    return trips


def trips_report(world: int) -> list[str]:
    """Round trips and agreements per NCF step, before and now."""
    before, now = round_trips(world, "max"), round_trips(world, "or")
    lines = [
        "",
        f"A step of make run's NCF (W = {world}, pool {POOL_SIZE}; buckets: user rows, item "
        "rows, the dense rest; the last one seals the step):",
        "",
        "| | switch round trips per bucket | per step | process-group agreements per step |",
        "|---|---|---:|---:|",
        f"| before (MAX, OR, ADD; every bucket agreed over gloo) | {before} | {sum(before)} | 3 |",
    ]
    verdicts = [t + 1 for t in now[:-1]] + [now[-1]]
    lines.append(
        f"| now (OR, ADD; a verdict packet but in the last bucket) | {verdicts} "
        f"| {sum(verdicts)} | 1 |"
    )
    return lines


def report(results: dict[str, dict[str, list[float]]], world: int, rounds: int) -> list[str]:
    """The markdown table: p50 and p99 per way and target, and the ratio to gloo's."""
    lines = [
        "# An agreement through the switch against the process group's",
        "",
        f"`python -m bench.agreement --world {world} --rounds {rounds}`: {world} ranks as "
        "threads of one process, each agreement started by every rank together, each "
        "rank's call timed; the two ways alternate round by round. ms per call.",
        "",
        "| target | way | p50 | p99 | gloo / way (p50) | calls |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for target, ways in results.items():
        gloo50 = float(np.percentile(ways[WAYS[1]], 50))
        for way, times in ways.items():
            ms = np.asarray(times) * 1e3
            p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
            lines.append(
                f"| {target} | {way} | {p50:.2f} | {p99:.2f} | {gloo50 * 1e3 / p50:.2f}x "
                f"| {ms.size} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure on every available target and write bench/results/agreement.md."""
    p = argparse.ArgumentParser(
        prog="python -m bench.agreement",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per way (default 10)")
    p.add_argument("--per-round", type=int, default=50, help="agreements per round (50)")
    p.add_argument("--targets", nargs="+", default=None, help="default: every target present")
    args = p.parse_args(argv)
    if not 2 <= args.world <= 32 or args.rounds < 1 or args.per_round < 1:
        p.error("--world must be 2..32, --rounds and --per-round positive")
    from homagg.lab.namespace import have_privileges
    from homagg.lab.switch_process import compared_targets

    if not have_privileges():
        p.error("needs root and iproute2 (network namespaces)")
    targets = args.targets or compared_targets()
    results = {t: measure(t, args.world, args.rounds, args.per_round) for t in targets}
    lines = report(results, args.world, args.rounds) + trips_report(args.world)
    publish(
        "agreement",
        lines,
        summary=", ".join(
            f"{t}: switch p50 {np.percentile(r[WAYS[0]], 50) * 1e3:.2f} ms, gloo "
            f"{np.percentile(r[WAYS[1]], 50) * 1e3:.2f} ms"
            for t, r in results.items()
        ),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
