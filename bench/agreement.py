"""The hook's agreement, measured both ways side by side: a verdict packet through the switch
(one MAX cell per rank, what a bucket within a step costs now) against the process group's
MAX of the `GlooVerdict` (what every bucket cost before, and what seals a step; one
all_gather, as the hook agrees: homagg/worker/ddp/gathered_max.py).

W ranks as threads of this process, each with its agent (its UDP socket in its host's
namespace, through the target's switch) and its own gloo process group over loopback (the
ranks' one host: gloo's best case). Rounds alternate the two ways; in a round every rank
starts each agreement together (a thread barrier) and times its own call. Prints the p50 and
p99 of those times per way and target. Then whole NCF steps through the same switch and
groups (make run's NCF's three buckets, lossless, each with its verdict, the step sealed
after), "before" (the exponents in a MAX phase, every bucket agreed over gloo) against
"now" and "one round" (the three buckets in one round, their phases coalesced, as the
blocking hook sends them), alternating round by round. Writes bench/results/agreement.md.
Beside it, counted in this process: the round trips and process-group agreements of such a
step, each way.

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
from run.control import run_pool_size

POOL_SIZE = run_pool_size(1)  # make run's job's, on its one switch
WAYS = ("switch verdict", "gloo MAX")  # gloo: the hook's MAX (one all_gather)
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
    """One MAX of a GlooVerdict over the process group, as the hook agrees (gloo_max)."""
    from homagg.worker.ddp.agreement import OK, GlooVerdict

    gloo_max(pg, GlooVerdict.local(0, OK, OK, OK, 0, 0).pack())


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
        out: dict[str, list[float]] = {w: [] for w in (*WAYS, *VARIANTS)}
        for i in range(rounds):
            for way in WAYS if i % 2 == 0 else WAYS[::-1]:
                out[way] += timed(calls[way], per_round)
        hooks = {v: step_hooks(agents, groups, v) for v in VARIANTS}
        for v in VARIANTS:  # warm up: the codecs, the first agreements
            ncf_steps(hooks[v], 2, one_round=VARIANTS[v][2])
        for i in range(rounds):
            for v in VARIANTS if i % 2 == 0 else list(VARIANTS)[::-1]:
                out[v] += ncf_steps(hooks[v], max(1, per_round // 10), one_round=VARIANTS[v][2])
        out["fallbacks"] = [float(sum(h.stats.fallbacks for h in hooks[v])) for v in VARIANTS]
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


def _bucket_phases(codec, x):
    """One rank's phases of one NCF bucket through the lossless codec (rows or flat)."""
    from homagg.worker.codecs import SparseRows

    return codec.aggregate_rows(x) if isinstance(x, SparseRows) else codec.aggregate(x)


def _trips(log: list) -> int:
    """Switch round trips of the logged phases (each once): a phase of more packets than
    the pool takes one per pool's worth."""
    packets = [-(-p.cells.size // CELLS) for p in log]
    return sum(-(-n // POOL_SIZE) for n in packets)


def round_trips(world: int, exponents: str) -> list[int]:
    """Switch round trips of each bucket's phases alone, the lossless codec's exponents as
    `exponents` says."""
    from homagg.worker.codecs import LosslessSparse
    from homagg.worker.codecs.simulate import drive

    buckets, trips = ncf_buckets(world), []
    for b in range(3):
        log: list = []
        codecs = [LosslessSparse(world, exponents=exponents, support_block=16) for _ in buckets]
        drive(
            [_bucket_phases(c, x[b]) for c, x in zip(codecs, buckets, strict=True)], phases_log=log
        )
        trips.append(_trips(log))
    return trips


def coalesced_round_trips(world: int) -> int:
    """Switch round trips of the three buckets' phases coalesced into one round, as the
    blocking hook sends a step's small buckets (homagg/worker/codecs/coalesce.py)."""
    from homagg.worker.codecs import LosslessSparse
    from homagg.worker.codecs.coalesce import coalesced_phases
    from homagg.worker.codecs.simulate import drive

    log: list = []
    ranks = [
        coalesced_phases([_bucket_phases(LosslessSparse(world, support_block=16), x) for x in xs])
        for xs in ncf_buckets(world)
    ]
    drive(ranks, phases_log=log)
    return _trips(log)


def trips_report(world: int) -> list[str]:
    """Round trips and agreements per NCF step, before, with a verdict a bucket, and with
    the buckets in one round."""
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
    verdicts = [t + 1 for t in now]
    lines.append(
        f"| a verdict (OR, ADD; a verdict packet in every bucket; the seal started after the "
        f"last) | {verdicts} | {sum(verdicts)} | 1 |"
    )
    one = coalesced_round_trips(world) + 1
    lines.append(
        f"| now, the blocking hook (the three buckets in one round: their phases coalesced, "
        f"one verdict; the seal started after it) | [{one}] | {one} | 1 |"
    )
    return lines


VARIANTS = {  # name: (verdicts through the switch, the lossless codec's exponents, a step
    # in one round: its buckets' phases coalesced, as the blocking hook sends them)
    "before": (False, "max", False),
    "now": (True, "or", False),
    "one round": (True, "or", True),
}


def gloo_hook_class() -> type:
    """A hook state whose agreements go over its own gloo process group (`pg`), as the
    threads of one process that play the ranks here need (no default group)."""
    import torch

    from homagg.worker.ddp.gathered_max import GatheredMax, start_max_over
    from homagg.worker.ddp.hook import SwitchHookState

    class Hook(SwitchHookState):
        pg: object = None  # the rank's gloo process group

        def reduce_max_async(self, t: torch.Tensor) -> GatheredMax:
            return start_max_over(self.pg, t)

    return Hook


def step_hooks(agents: list, groups: list, variant: str) -> list:
    """Every rank's hook state for `variant`, agreeing over its gloo group."""
    through_switch, exponents, _ = VARIANTS[variant]
    hook = gloo_hook_class()
    hooks = []
    for r, (a, g) in enumerate(zip(agents, groups, strict=True)):
        h = hook(
            a,
            "lossless",
            world_size=len(agents),
            rank=r,
            codec_options={"exponents": exponents, "support_block": 16},
            switch_agreements=through_switch,
        )
        h.pg = g
        hooks.append(h)
    return hooks


def _rows_of(codec, x):
    """The phases of a table's rows through the lossless codec (a sparse bucket's)."""
    return codec.aggregate_rows(x)


def gloo_max(pg, t) -> None:
    """MAX over the ranks of `t` in place, through a gloo process group, as the hook's
    agreements are (homagg/worker/ddp/gathered_max.py: one all_gather)."""
    from homagg.worker.ddp.gathered_max import start_max_over

    start_max_over(pg, t).wait()


def ncf_steps(
    hooks: list, steps: int, budgets: dict[int, float] | None = None, one_round: bool = False
) -> list[float]:
    """`steps` NCF steps (three buckets, the last one sealing the step; `one_round`: the
    three in one round, as the blocking hook sends them) on every rank at once, each step
    ended with `budgets` (codec="auto"'s decision; None: no auto); every rank's seconds per
    step."""
    from homagg.worker.ddp.switch_path import Gradient, Part, Via, agreed_sums

    buckets = ncf_buckets(len(hooks), seed=1)
    barrier = threading.Barrier(len(hooks), timeout=60)

    def rank(r: int) -> list[float]:
        h, times = hooks[r], []
        for _ in range(steps):
            barrier.wait()
            start = time.perf_counter()
            h.use_switch()
            parts = [
                Part(b, Gradient(x), x.size)
                if b == 2
                else Part(b, Via(partial(_rows_of, x=x)), x.nrows * x.values.shape[1])
                for b, x in enumerate(buckets[r])
            ]
            for group in [parts] if one_round else [[p] for p in parts]:
                agreed_sums(h, group, last=group[-1] is parts[-1])
            h.end_step(budgets)
            times.append(time.perf_counter() - start)
        h.fallback.settle(h)  # the last step's seal (the next step's start read the others)
        return times

    from homagg.lab.threads import run_threads

    return [
        t for ts in run_threads([partial(rank, r) for r in range(len(hooks))], 900)[1] for t in ts
    ]


def ways_table(results: dict[str, dict[str, list[float]]], ways: tuple[str, str]) -> list[str]:
    """The markdown table of the two ways' calls (`ways`: the switch's key, then gloo's): p50
    and p99 per way and target, and the ratio to gloo's."""
    lines = [
        "| target | way | p50 | p99 | gloo / way (p50) | calls |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for target, got in results.items():
        gloo50 = float(np.percentile(got[ways[1]], 50))
        for way in ways:
            ms = np.asarray(got[way]) * 1e3
            p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
            lines.append(
                f"| {target} | {way} | {p50:.2f} | {p99:.2f} | {gloo50 * 1e3 / p50:.2f}x "
                f"| {ms.size} |"
            )
    return lines


def report(results: dict[str, dict[str, list[float]]], world: int, rounds: int) -> list[str]:
    """The markdown tables: each way's calls, and each variant's NCF steps."""
    lines = [
        "# An agreement through the switch against the process group's",
        "",
        f"`python -m bench.agreement --world {world} --rounds {rounds}`: {world} ranks as "
        "threads of one process, each agreement started by every rank together, each "
        "rank's call timed; the two ways alternate round by round. ms per call.",
        "",
        *ways_table(results, WAYS),
    ]
    lines += [
        "",
        "An NCF step (three buckets of make run's NCF through the switch, lossless; every "
        "rank's step timed, the variants alternating round by round). before: the "
        "exponents in a MAX phase, every bucket agreed over gloo; now: the exponents in the "
        "OR phase, a verdict packet per bucket, the step's seal over gloo started after the "
        "last and read at the next step's start (here steps follow each other without "
        "computation, so it is waited for in full); one round: as now, the three buckets in "
        "one round, their phases coalesced, one verdict (the blocking hook). ms per step:",
        "",
        "| target | variant | p50 | p99 | before / variant (p50) | steps | fallbacks |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for target, ways in results.items():
        before50 = float(np.percentile(ways["before"], 50))
        for i, v in enumerate(VARIANTS):
            ms = np.asarray(ways[v]) * 1e3
            p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
            lines.append(
                f"| {target} | {v} | {p50:.1f} | {p99:.1f} | {before50 * 1e3 / p50:.2f}x "
                f"| {ms.size} | {int(ways['fallbacks'][i])} |"
            )
    return lines


def rounds_arguments(
    prog: str, doc: str, what: str, argv: list[str] | None
) -> tuple[argparse.Namespace, list[str]]:
    """The command line the agreement benchmarks share (world, rounds, `what` per round,
    targets), checked, and the targets to measure (default: every one present)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per way (default 10)")
    p.add_argument("--per-round", type=int, default=50, help=f"{what} per round (50)")
    p.add_argument("--targets", nargs="+", default=None, help="default: every target present")
    args = p.parse_args(argv)
    if not 2 <= args.world <= 32 or args.rounds < 1 or args.per_round < 1:
        p.error("--world must be 2..32, --rounds and --per-round positive")
    from homagg.lab.namespace import have_privileges
    from homagg.lab.switch_process import compared_targets

    if not have_privileges():
        p.error("needs root and iproute2 (network namespaces)")
    return args, args.targets or compared_targets()


def ways_summary(
    results: dict[str, dict[str, list[float]]], what: str, ways: tuple[str, str] = WAYS
) -> str:
    """The SUMMARY line: per target, `what`'s p50 through the switch and over gloo (`ways`:
    the two ways' keys in results, the switch's first)."""
    return ", ".join(
        f"{t}: {what} p50 switch {np.percentile(r[ways[0]], 50) * 1e3:.2f} ms, gloo "
        f"{np.percentile(r[ways[1]], 50) * 1e3:.2f} ms"
        for t, r in results.items()
    )


def main(argv: list[str] | None = None) -> int:
    """Measure on every available target and write bench/results/agreement.md."""
    args, targets = rounds_arguments("python -m bench.agreement", __doc__, "agreements", argv)
    results = {t: measure(t, args.world, args.rounds, args.per_round) for t in targets}
    lines = report(results, args.world, args.rounds) + trips_report(args.world)
    publish(
        "agreement",
        lines,
        summary=ways_summary(results, "verdict"),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
