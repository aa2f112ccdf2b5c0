"""Beyond one switch, measured: bytes per worker and step time of dense fixed-point
aggregation at several W on one switch (W <= 32), on a two-level tree (leaves x workers
under a parent switch, homagg/lab/tree_fabric.py and tree_job.py) and with gloo's ring
all_reduce at the same W, side by side in one run (every repetition runs every layout in
turn), plus one switch round trip flat against the tree's (the transport's latency from
a chunk's first send to its result, over steps of one packet a phase).

Workers are threads of this process, one namespace and UDP socket each, driven by
bench/aggregation.py's SwitchGroup; each layout has its own fabric (a job's worker UDP
ports are fixed per rank). Every step's sums are checked exact: every worker decodes the
same bits as the codec run in lockstep without a network (homagg/worker/codecs/simulate).
The projection model (bench/projection_model.py) predicts each row from the committed
calibration (bench/results/projection_calibration.json) where it has the target.

    python -m bench.tree_scaling [--flat 2 8 16 32] [--tree 2x1 2x4 2x8 2x16 4x16]
        [--gloo 2 8 16 32 64] [--n 131072] [--reps 3] [--targets refswitch ebpf]
        [--name tree_scaling]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack
from typing import Any

import numpy as np

from bench.aggregation import POOL_SIZE, GlooPool, SwitchGroup
from bench.projection_model import ModelError
from bench.publish import plot_path, publish
from bench.tree_scaling_report import Layout, parse_tree, plan, predicted, rows, summary
from bench.tree_scaling_report import plot as plot_rows
from bench.tree_scaling_report import table as target_table
from homagg.lab.switch_process import PRESENT_TARGETS
from homagg.wire.constants import CELLS_PER_PKT

# the aggregation benchmark's retransmission timeouts: BMv2 answers slower
INITIAL_TIMEOUT = {"refswitch": 0.02, "ebpf": 0.02, "bmv2": 0.2}
RTT_STEPS = 10  # one-packet steps per repetition and layout (their chunk latencies)
NAMES = {"refswitch": "reference switch", "ebpf": "eBPF", "bmv2": "BMv2"}


def build(stack: ExitStack, target: str, lay: Layout) -> SwitchGroup:
    """The layout's switches (closed by `stack`) and its workers' transports."""
    from homagg.lab.fabric import Fabric
    from homagg.lab.tree_fabric import TreeFabric
    from homagg.lab.tree_job import TreeJob

    timeout = INITIAL_TIMEOUT[target]
    if lay.kind == "flat":
        fabric = stack.enter_context(Fabric(target, lay.workers))
        hosts = fabric.hosts
        make = lambda: SwitchGroup(fabric, lay.workers, timeout)  # noqa: E731
    else:
        tree = stack.enter_context(TreeFabric(target, lay.leaves, lay.per_leaf))
        hosts = [h for leaf in tree.leaves for h in leaf.hosts]
        job = TreeJob(tree, [lay.per_leaf] * lay.leaves, pool_size=POOL_SIZE)
        make = lambda: SwitchGroup(None, lay.workers, timeout, job=job)  # noqa: E731
    for h in hosts:
        h.enable_ip_stack()
    group = make()
    stack.callback(group.close)
    return group


def _step(group: SwitchGroup, xs: list[np.ndarray], expected: np.ndarray) -> dict[str, Any]:
    """One dense fixed-point step of every worker, checked exact: wall, packets, retx."""
    from homagg.worker.codecs import FixedPoint

    sent0 = sum(t.stats.packets_sent for t in group.transports)
    secs, out, retx = group.step([FixedPoint(group.w) for _ in range(group.w)], xs)
    wrong = [r for r, o in enumerate(out) if not np.array_equal(o, expected)]
    if wrong:
        raise RuntimeError(f"W={group.w}: ranks {wrong} decoded a sum other than the codec's")
    packets = sum(t.stats.packets_sent for t in group.transports) - sent0
    return {"secs": secs, "packets": packets, "retx": retx}


def _round_trip(group: SwitchGroup, xs: list[np.ndarray]) -> float:
    """Median latency of one-packet chunks (first send to result) over RTT_STEPS steps."""
    from homagg.worker.codecs import FixedPoint

    for t in group.transports:
        t.stats.latencies.clear()
    small = [x[:CELLS_PER_PKT] for x in xs]
    for _ in range(RTT_STEPS):
        group.step([FixedPoint(group.w) for _ in range(group.w)], small)
    return statistics.median(lat for t in group.transports for lat in t.stats.latencies)


def expected_sum(xs: list[np.ndarray]) -> np.ndarray:
    """What every worker must decode: the fixed-point codec run in lockstep, no network."""
    from homagg.worker.codecs import FixedPoint
    from homagg.worker.codecs.simulate import simulate

    return simulate([FixedPoint(len(xs)) for _ in xs], xs)[0]


def measure_target(
    target: str, layouts: list[Layout], n: int, reps: int, gloo: GlooPool | None
) -> dict[Layout, dict[str, Any]]:
    """Every layout's steps, alternating rep by rep (gloo's in the same turn)."""
    rng = np.random.default_rng(3)
    inputs = {
        w: [rng.standard_normal(n).astype(np.float32) for _ in range(w)]
        for w in {lay.workers for lay in layouts}
    }
    expected = {w: expected_sum(xs) for w, xs in inputs.items()}
    measured: dict[Layout, dict[str, Any]] = {
        lay: {"secs": [], "packets": [], "rtt": [], "retx": 0} for lay in layouts
    }
    with ExitStack() as stack:
        groups = {lay: build(stack, target, lay) for lay in layouts if lay.kind != "gloo"}
        for lay, group in groups.items():  # warm-up
            group.step([_codec(lay.workers) for _ in range(lay.workers)], inputs[lay.workers])
        for rep in range(reps):
            for lay in layouts:
                rec = measured[lay]
                if lay.kind == "gloo":
                    if gloo is None:
                        raise ValueError("gloo layouts need a GlooPool")
                    rec["secs"].append(gloo.run(lay.workers, n))
                else:
                    got = _step(groups[lay], inputs[lay.workers], expected[lay.workers])
                    rec["secs"].append(got["secs"])
                    rec["packets"].append(got["packets"])
                    rec["retx"] += got["retx"]
                    rec["rtt"].append(_round_trip(groups[lay], inputs[lay.workers]))
                print(
                    f"  {target} rep {rep + 1}/{reps} {lay.label}: {rec['secs'][-1] * 1e3:.1f} ms"
                    + (f", round trip {rec['rtt'][-1] * 1e6:.0f} us" if rec["rtt"] else ""),
                    flush=True,
                )
    return measured


def _codec(w: int) -> Any:
    from homagg.worker.codecs import FixedPoint

    return FixedPoint(w)


def add_predictions(target: str, measured: dict[Layout, dict[str, Any]], n: int) -> str:
    """The model's step time per row from the committed calibration, as bench.projection
    --check predicts its rows (W threads at the calibrated per-thread cost); a note for the
    report (why there is none, or the cores the prediction assumed)."""
    from bench.calibration import available_cores, costs_of, load, switch_pps_of, threaded_costs

    try:
        record = load()
        costs_of(record, target)  # a ModelError when the target is not calibrated
    except ModelError as exc:
        return f"No prediction: {exc}."
    cores = available_cores()
    pps = switch_pps_of(record, target)
    for lay, rec in measured.items():
        costs = threaded_costs(record, target, lay.workers)
        rec["predicted"] = predicted(lay, n, costs, pps, cores)
    return (
        f"Predicted: the projection model with the calibration of {record.get('date', '?')} "
        f"on {cores:.2f} cores found free after the run (one round trip per switch level; "
        "the busiest switch's packets: a leaf's workers' and the parent's result)."
    )


def resolve_targets(asked: list[str]) -> list[str]:
    """The targets to run, `present` standing for refswitch and ebpf where it loads."""
    from homagg.lab.switch_process import ebpf_available

    out: list[str] = []
    for t in asked:
        got = (
            (["refswitch"] + (["ebpf"] if ebpf_available() else []))
            if t == PRESENT_TARGETS
            else [t]
        )
        out += [g for g in got if g not in out]
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--flat",
        type=int,
        nargs="*",
        default=[2, 8, 16, 32],
        help="W on one switch (default 2 8 16 32; W = 2 beside the tree 2x1 is the round "
        "trip with the least queueing)",
    )
    p.add_argument(
        "--tree",
        type=parse_tree,
        nargs="*",
        default=[parse_tree(t) for t in ("2x1", "2x4", "2x8", "2x16", "4x16")],
        help="two-level trees, LEAVESxWORKERS each (default 2x1 2x4 2x8 2x16 4x16)",
    )
    p.add_argument(
        "--gloo", type=int, nargs="*", default=[2, 8, 16, 32, 64], help="W of gloo's ring"
    )
    p.add_argument(
        "--n", type=int, default=131_072, help="float32 elements per worker (default 131,072)"
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument(
        "--targets",
        nargs="+",
        choices=[*sorted(NAMES), PRESENT_TARGETS],
        default=["refswitch"],
        help="switch targets, in turn (default refswitch; present: refswitch and ebpf where "
        "the kernel allows it; BMv2 forwards too few packets/s for W = 64 in minutes)",
    )
    p.add_argument("--name", default="tree_scaling", help="results file stem")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from homagg.lab.namespace import have_privileges

    try:
        layouts = plan(args.flat, args.tree, args.gloo)
    except ValueError as exc:
        print(f"bench.tree_scaling: {exc}", file=sys.stderr)
        return 2
    if not have_privileges():
        print("bench.tree_scaling needs root (network namespaces)", file=sys.stderr)
        return 1
    targets = resolve_targets(args.targets)
    start = time.perf_counter()
    per_target, notes = {}, {}
    worlds = tuple(sorted({lay.workers for lay in layouts if lay.kind == "gloo"}))
    gloo = GlooPool([args.n], worlds) if worlds else None
    try:
        for target in targets:
            print(f"tree scaling: {NAMES[target]}, n = {args.n:,}, {args.reps} reps", flush=True)
            chosen = [lay for lay in layouts if lay.kind != "gloo" or gloo is not None]
            measured = measure_target(target, chosen, args.n, args.reps, gloo)
            notes[target] = add_predictions(target, measured, args.n)
            per_target[NAMES[target]] = rows(measured, args.n)
    finally:
        if gloo is not None:
            gloo.close()
    lines = _intro(args, time.perf_counter() - start)
    for (name, rows_), note in zip(per_target.items(), notes.values(), strict=True):
        lines += [*target_table(name, rows_, args.n), note, ""]
    line = summary(per_target)
    lines.append(f"Summary: {line}.")  # bench.summary's line for `make bench`
    plot_rows(per_target, plot_path(f"{args.name}.png"))
    publish(args.name, lines, line)
    return 0


def _intro(args: argparse.Namespace, elapsed: float) -> list[str]:
    import os
    import platform

    load = os.getloadavg()[0]
    return [
        f"# One switch, a two-level tree and gloo's ring by W ({platform.machine()}, "
        f"{os.cpu_count()} cores, load average {load:.1f}, {time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"`python -m bench.tree_scaling {' '.join(sys.argv[1:])}`; ran in {elapsed:.0f} s. "
        f"Plot: {args.name}.png.",
        "",
        "Dense fixed point, W worker threads (one namespace and UDP socket each) on one "
        "switch (flat) or a two-level tree (LEAVES x WORKERS, a parent switch above the "
        "leaves, every switch its own process or XDP program), and gloo's ring all_reduce "
        "(W processes on loopback), every layout once per repetition in turn; every step's "
        "sums checked exact against the codec run without a network. Bytes per worker: the "
        "switch's measured (packets its transport sent x the frame, retransmissions "
        "included) over the dense gradient's; the ring's 2(W-1)/W (payload). Round trip: "
        "median latency of one-packet chunks, first send to result. The machine is shared "
        "and loaded (load average above): read the ratios measured side by side, not the "
        "absolute times. vs flat / vs gloo: step (or round trip) time over the same W's.",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
