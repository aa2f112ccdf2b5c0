"""A slow rank is not a dead path, measured: one rank of a job pauses before its step (a
checkpoint write, a slow data loader) or dies, on each switch target, through a controller.

"pause": rank 1 sleeps --pause s before its all-reduce; rank 0 has already sent its pool
and waits. Per repetition: how long rank 0 waited, its retransmissions and probes meanwhile,
whether any rank fell back (TransportError) and whether the sums were exact. "pause, no
wait" is the same without the straggler wait (the transport's former behaviour: no
evidence of the peers, so a spent retry budget fails at once). "killed": rank 1 stops
(no heartbeat, no packet) and rank 0 starts a step: how long until it ends, against the
lease. Two ranks, pool 8 (make run's), the transport's defaults, the controller's lease 3 s
and heartbeat 0.2 s (the tests' timing). Writes bench/results/straggler.md.

    python -m bench.straggler [--reps 3] [--pause 10] [--targets refswitch bmv2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from bench.publish import publish

POOL_SIZE = 8
WORLD = 2
STEP_TIMEOUT = 300.0
SCENARIOS = ("pause", "pause, no wait", "killed")


def open_agents(c, job) -> list:
    """Every rank's agent, joined concurrently (WaitReady blocks until all joined)."""
    from homagg.lab.threads import run_threads
    from homagg.worker.job.agent import WorkerAgent

    def join(r: int) -> WorkerAgent:
        return WorkerAgent(c.agent_config(job, r), c.socket_factory(r))

    return run_threads([partial(join, r) for r in range(WORLD)], 60)[1]


def timed_step(agents, delays: dict[int, float], cells: np.ndarray) -> list[tuple]:
    """Every rank's all-reduce at once, rank r after sleeping delays.get(r, 0) s: per rank
    (the sum or the TransportError, seconds its call took, retransmissions during it)."""
    from homagg.lab.threads import run_threads
    from homagg.wire.constants import Op

    def one(r: int) -> tuple:
        time.sleep(delays.get(r, 0.0))
        t = agents[r].transport
        retx0, start = t.stats.retransmissions, time.monotonic()
        try:
            res = t.allreduce(Op.ADD, cells)
        except Exception as exc:
            res = exc
        return res, time.monotonic() - start, t.stats.retransmissions - retx0

    return run_threads([partial(one, r) for r in range(WORLD)], STEP_TIMEOUT)[1]


def run_case(c, scenario: str, pause: float) -> dict:
    """One repetition of a scenario on a fresh job: what rank 0 saw."""
    from homagg.wire.constants import CELLS_PER_PKT, Op
    from homagg.worker.transport.switch_transport import TransportError

    cells = np.arange(4 * POOL_SIZE * CELLS_PER_PKT, dtype=np.int32)
    job = c.create(WORLD, pool_size=POOL_SIZE)
    agents = open_agents(c, job)
    try:
        timed_step(agents, {}, cells)  # a step before: the path is proven, the timer learns
        t0 = agents[0].transport
        probes0 = t0.wait.probes
        if scenario == "killed":
            # rank 1 dies: its heartbeats stop (as the agent's thread would with the process)
            # and it sends nothing more
            agents[1]._stop.set()
            agents[1]._thread.join(5)
            retx0, start = t0.stats.retransmissions, time.monotonic()
            try:
                res: object = t0.allreduce(Op.ADD, cells)
            except TransportError as exc:
                res = exc
            steps = [(res, time.monotonic() - start, t0.stats.retransmissions - retx0)]
        else:
            if scenario == "pause, no wait":
                for a in agents:
                    a.transport.wait.peers_problem = None
            steps = timed_step(agents, {1: pause}, cells)
        res0, seconds, retx = steps[0]
        return {
            "seconds": seconds,
            "retx": retx,
            "probes": t0.wait.probes - probes0,
            "fell_back": sum(isinstance(s[0], Exception) for s in steps),
            "exact": all(
                isinstance(s[0], np.ndarray) and np.array_equal(s[0], WORLD * cells) for s in steps
            ),
            "error": str(res0) if isinstance(res0, Exception) else "",
        }
    finally:
        for a in agents:
            a.close()


def measure(target: str, reps: int, pause: float) -> dict[str, list[dict]]:
    """Every scenario `reps` times on one controller and switch, the scenarios alternating."""
    from homagg.lab.controlled import Controlled

    rows: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
    c = Controlled(Path(tempfile.mkdtemp(prefix="bench-straggler-")), WORLD, True, target=target)
    try:
        for _ in range(reps):
            for scenario in SCENARIOS:
                rows[scenario].append(run_case(c, scenario, pause))
                print(target, scenario, rows[scenario][-1], flush=True)
    finally:
        c.close()
    return rows


def _spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """Median [min, max]."""
    return (
        f"{fmt.format(statistics.median(values))} "
        f"[{fmt.format(min(values))}, {fmt.format(max(values))}]"
    )


def report(results: dict[str, dict[str, list[dict]]], reps: int, pause: float) -> list[str]:
    """The markdown table of bench/results/straggler.md."""
    from homagg.lab.controlled import TIMING

    lease = TIMING["lease"]
    lines = [
        "# A slow rank is not a dead path",
        "",
        f"`python -m bench.straggler --reps {reps} --pause {pause:g}` on {platform.machine()} "
        f"({os.cpu_count()} cores, shared), {time.strftime('%Y-%m-%d')}. {WORLD} ranks, pool "
        f"{POOL_SIZE}, {4 * POOL_SIZE} chunks per step, the transport's defaults; lease "
        f"{lease:g} s, heartbeat {TIMING['heartbeat_interval']:g} s. Rank 0's step: seconds, "
        "retransmissions and probes during it, median [min, max] over the repetitions; "
        "fell back: steps in which a rank raised TransportError (of "
        f"{reps} x {WORLD} for the pauses, {reps} for the kill).",
        "",
        "| target | case | rank 0's step (s) | retransmissions | probes | fell back | exact |",
        "|---|---|--:|--:|--:|--:|---|",
    ]
    for target, rows in results.items():
        for scenario in SCENARIOS:
            rs = rows[scenario]
            case = f"rank 1 pauses {pause:g} s" if scenario != "killed" else "rank 1 killed"
            if scenario == "pause, no wait":
                case += ", no straggler wait (former)"
            lines.append(
                f"| {target} | {case} | {_spread([r['seconds'] for r in rs])} "
                f"| {_spread([r['retx'] for r in rs], '{:.0f}')} "
                f"| {_spread([r['probes'] for r in rs], '{:.0f}')} "
                f"| {sum(r['fell_back'] for r in rs)} "
                f"| {'yes' if all(r['exact'] for r in rs) else 'no'} |"
            )
    lines.append("")
    for target, rows in results.items():
        killed = [r["seconds"] for r in rows["killed"]]
        by_lease = sum("lease of rank 1 expired" in r["error"] for r in rows["killed"])
        budget = sum("no evidence that the peers" in r["error"] for r in rows["pause, no wait"])
        lines.append(
            f"- {target}: a killed rank ends the step after {_spread(killed)} s, "
            f"{max(killed) / lease:.2f} x the lease at most ({by_lease} of {reps} because the "
            "controller ended the job on the dead rank's expired lease); without the straggler "
            f"wait rank 0 fell back on a spent retry budget {budget} of {reps} times."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure on every available target and write bench/results/straggler.md."""
    p = argparse.ArgumentParser(
        prog="python -m bench.straggler",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions per case (default 3)")
    p.add_argument("--pause", type=float, default=10.0, help="rank 1's pause, s (default 10)")
    p.add_argument(
        "--targets", nargs="+", default=None, help="default: refswitch, and bmv2 when installed"
    )
    args = p.parse_args(argv)
    if args.reps < 1 or not args.pause > 0:
        p.error("--reps and --pause must be positive")
    from homagg.lab.namespace import have_privileges
    from homagg.lab.switch_process import compared_targets

    if not have_privileges():
        p.error("needs root and iproute2 (network namespaces)")
    targets = args.targets or compared_targets()
    results = {t: measure(t, args.reps, args.pause) for t in targets}
    publish(
        "straggler",
        report(results, args.reps, args.pause),
        summary=", ".join(
            f"{t} pause {args.pause:g} s: fell back "
            f"{sum(r['fell_back'] for r in rows['pause'])}, killed rank ends the step in "
            f"{statistics.median(r['seconds'] for r in rows['killed']):.1f} s"
            for t, rows in results.items()
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
