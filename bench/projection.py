"""Project one gradient aggregation's step time to a cluster you describe: through the
switch (dense fixed point, or the lossless codec when it sends fewer packets) beside ring
and halving-doubling all-reduce (the alpha-beta model NCCL's and gloo's algorithms
follow), from per-packet costs and round trips; where the switch wins and by how much.

    python -m bench.projection [--workers 8 32 128] [--link-gbps 10 100 400]
        [--density 1 0.01] [--elements 25000000] [--costs line-rate|refswitch|ebpf]
        [--json] [--no-plot]
    python -m bench.projection --calibrate [--targets refswitch ebpf]   (root)
    python -m bench.projection --check [--check-workers 2 4 8]          (root)
    python -m bench.projection --check-runs DIR [DIR ...] [--start-runs]  (root to start)

Costs: `line-rate` (default) is a cluster whose workers and switch keep up with their links
(a kernel-bypass worker as SwitchML's, a hardware switch) and whose round trip and peer
step are --rtt-us and --alpha-us; `refswitch` / `ebpf` are this project's workers and
switch as calibrated on this machine (bench/results/projection_calibration.json: the Python
worker's CPU per packet, the switch's, the round trip, gloo's alpha and per-byte costs, the
software switches' forwarding of a frame), each worker on a host of its own. --worker-us,
--rtt-us, --alpha-us and --switch-pps override any of them. --calibrate measures and
rewrites the calibration (the aggregation benchmark's pieces, short runs); --check
calibrates, then measures dense fixed point through one switch and gloo's all_reduce at
each --check-workers, side by side, and prints the model's prediction for this machine
beside them (bench/results/projection_check.md). --check-runs puts the model beside
Mininet training runs (`python -m run`'s output directories, with its printed output saved
as run.log; the dense MLP, blocking): the switch's and gloo's communication per step,
predicted and measured (bench/results/projection_runs.md); --start-runs first starts them
there (--run-topos, --run-target, --run-steps, --run-pool-size). Tables and the plot:
bench/results/projection.md and .png."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench import calibration
from bench.projection_model import Cluster, Costs, ModelError, project
from bench.projection_plot import PUBLISHED, plot
from bench.projection_run_start import RunSpec, start_run
from bench.publish import plot_path, publish

PLOT_WORKERS = tuple(2**k for k in range(1, 11))  # 2 .. 1024
CALIBRATE_ELEMENTS = 1 << 20  # 4,097 packets a worker: short, and enough CPU ticks
LARGE_WORLDS_ELEMENTS = 1 << 18  # per worker at W > 8 (keeps W = 32 to seconds a step)


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and every option's default in its help."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.projection",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=_Formatter,
    )
    a = p.add_argument
    a("--workers", type=int, nargs="+", default=[8, 32, 128], help="W values of the table")
    a("--link-gbps", type=float, nargs="+", default=[10, 100, 400], help="link rates (Gbit/s)")
    a(
        "--density",
        type=float,
        nargs="+",
        default=[1.0, 0.1, 0.01, 0.001],
        help="nonzeros per worker, at independent positions",
    )
    a("--elements", type=int, default=25_000_000, help="float32 gradient elements (25M)")
    a(
        "--costs",
        choices=("line-rate", "refswitch", "ebpf"),
        default="line-rate",
        help="line-rate hosts and switch, or this project's target as calibrated here",
    )
    a("--worker-us", type=float, help="a worker's cost per packet sent and result received")
    a("--rtt-us", type=float, help="one worker-switch-worker round trip (line-rate: 10)")
    a("--alpha-us", type=float, help="one step of a peer algorithm (line-rate: 10)")
    a(
        "--switch-pps",
        type=float,
        help="contributions/s the switch absorbs (0: line rate; --check-runs: BMv2's, which "
        "is not calibrated)",
    )
    a("--depth", type=int, default=0, help="switch levels (0: as few as hold W, 32 a switch)")
    a(
        "--pool-size",
        type=int,
        default=0,
        help="slots a worker keeps in flight (0: the bandwidth-delay product, as SwitchML "
        "sizes its pool; this project's jobs use 32)",
    )
    a("--compute-ms", type=float, default=0.0, help="the step's computation, not overlapped")
    a("--json", action="store_true", help="print the rows as JSON instead of the table")
    a("--no-plot", action="store_true", help="leave the plot out")
    a("--name", default="projection", help="results file stem (projection)")
    a("--check-name", default="projection_check", help="the check's results file stem")
    a("--calibrate", action="store_true", help="measure the costs here first (root)")
    a("--check", action="store_true", help="calibrate, then check the model here (root)")
    a(
        "--targets",
        nargs="+",
        choices=("refswitch", "ebpf", "bmv2"),
        default=None,
        help="switch targets to calibrate and check (default: refswitch, and ebpf where "
        "the kernel allows it)",
    )
    a(
        "--check-workers",
        type=int,
        nargs="+",
        default=[2, 4, 8],
        help="W of the check (above 8: threads of one process, at 262,144 elements, with W = 8 "
        "again at that size beside them)",
    )
    a("--check-elements", type=int, default=CALIBRATE_ELEMENTS, help="elements of the check")
    a("--reps", type=int, default=3, help="repetitions of each measurement (3)")
    a(
        "--passes",
        type=int,
        default=3,
        help="whole calibrations merged into their medians: one pass's costs move by "
        "20-40%% with where its processes land",
    )
    _run_options(p)
    return p


def _run_options(p: argparse.ArgumentParser) -> None:
    """The options of the check against Mininet runs (bench/projection_runs.py)."""
    g = p.add_argument_group("the check against Mininet training runs")
    a = g.add_argument
    a(
        "--check-runs",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="--out directories of `python -m run` (dense MLP, blocking, with what it "
        "printed saved there as run.log)",
    )
    a(
        "--start-runs",
        action="store_true",
        help="first start a run per --run-topos, into subdirectories of the first DIR (root)",
    )
    a(
        "--run-topos",
        nargs="+",
        default=["star", "two-level"],
        help="star: --hosts 4, unshaped (star<N>: N hosts, e.g. star2: a core a rank on 2 "
        "cores); else a --topo of python -m run (two-level)",
    )
    a(
        "--run-target",
        default="refswitch",
        help="the started runs' --target (refswitch: calibrated; bmv2: calibrated with "
        "--calibrate --targets ... bmv2, else give --switch-pps)",
    )
    a("--run-steps", type=int, default=12, help="the started runs' --steps")
    a(
        "--run-pool-size",
        type=int,
        default=RunSpec.pool_size,
        help="the started runs' --pool-size (make run's default)",
    )
    a(
        "--run-repeats",
        type=int,
        default=1,
        help="runs of each topology, alternating (the check compares each configuration's "
        "median run too: two identical runs here differ by 10-40%%)",
    )
    a(
        "--run-cores",
        type=float,
        default=0.0,
        help="cores the runs had (0: os.cpu_count()); the machine's other load is the share "
        "of a core sampled during each run (its load.jsonl; none: a share of 1)",
    )
    a("--runs-name", default="projection_runs", help="the run check's results file stem")


def costs_and_switch(args: argparse.Namespace) -> tuple[Costs, float]:
    """The Costs and switch packet rate the arguments select (overrides applied)."""
    if args.costs == "line-rate":
        costs, pps = Costs(), 0.0
    else:
        costs, pps = calibration.cluster_costs(calibration.load(), args.costs)
    for flag, name in (
        ("worker_us", "worker_packet_s"),
        ("rtt_us", "rtt_s"),
        ("alpha_us", "alpha_s"),
    ):
        if getattr(args, flag) is not None:
            costs = replace(costs, **{name: getattr(args, flag) * 1e-6})
    if args.switch_pps is not None:
        pps = args.switch_pps
    return costs, pps


def cluster_of(args: argparse.Namespace, w: int, link: float, d: float, pps: float) -> Cluster:
    """The cluster of one table row (each worker on a host of its own)."""
    return Cluster(
        workers=w,
        link_gbps=link,
        elements=args.elements,
        density=d,
        switch_pps=pps,
        depth=args.depth,
        pool_size=args.pool_size,
        compute_s=args.compute_ms * 1e-3,
    )


def table_rows(args: argparse.Namespace, costs: Costs, pps: float) -> list[dict[str, Any]]:
    """One row per W, link rate and density: every method's time, bytes and bound."""
    rows = []
    for d in args.density:
        for link in args.link_gbps:
            for w in args.workers:
                cluster = cluster_of(args, w, link, d, pps)
                p = project(cluster, costs)
                rows.append(
                    {
                        "workers": w,
                        "link_gbps": link,
                        "density": d,
                        "levels": cluster.levels,
                        "methods": {k: asdict(v) for k, v in p.items()},
                        "speedup": p["peer"].seconds / p["switch"].seconds,
                    }
                )
    return rows


def report(args: argparse.Namespace, costs: Costs, pps: float, rows: list[dict]) -> list[str]:
    """Markdown: the costs used, then the table."""
    lines = [
        f"# Projection: the switch beside ring and halving-doubling all-reduce "
        f"({time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m bench.projection {' '.join(sys.argv[1:])}`".replace("  ", " "),
        "",
        f"Costs: {args.costs}; worker {costs.worker_packet_s * 1e6:g} us/packet, switch "
        + (f"{pps:,.0f} contributions/s" if pps else "at line rate")
        + f", round trip {costs.rtt_s * 1e6:g} us, peer step (alpha) {costs.alpha_s * 1e6:g} us"
        f", peer host cost {costs.peer_byte_s * 1e9:g} ns/byte; {args.elements:,} float32 "
        f"elements, pool {args.pool_size or 'bandwidth x delay'} slots, "
        f"compute {args.compute_ms:g} ms. "
        "Density: nonzeros per worker at independent positions (the lossless codec's worst "
        "case); the peers all-reduce the dense gradient. Bytes: each worker's, x the "
        "dense gradient. Plot: projection.png.",
        "",
        "| W | link Gbit/s | density | levels | switch ms (codec, bound) | ring ms | "
        "halving-doubling ms | best peer / switch | bytes switch / ring |",
        "|--:|--:|--:|--:|---|--:|--:|--:|---|",
    ]
    dense = 4.0 * args.elements
    for r in rows:
        m = r["methods"]
        sw = m["switch"]
        codec = "lossless" if sw["method"].endswith("lossless") else "fixed point"
        lines.append(
            f"| {r['workers']} | {r['link_gbps']:g} | {r['density']:g} | {r['levels']} | "
            f"{sw['seconds'] * 1e3:.2f} ({codec}, {sw['limit']}) | "
            f"{m['ring']['seconds'] * 1e3:.2f} | {m['halving_doubling']['seconds'] * 1e3:.2f} | "
            f"**{r['speedup']:.3g}x** | {sw['bytes_per_worker'] / dense:.3f} / "
            f"{m['ring']['bytes_per_worker'] / dense:.3f} |"
        )
    lines += ["", "Published (abstracts; their own testbeds): "]
    lines[-1] += "; ".join(p.label for p in PUBLISHED) + "."
    return [*lines, "", f"Summary: {summary(rows)}.", ""]


def summary(rows: list[dict]) -> str:
    """The part's one line: the best and worst speedup in the table."""
    best = max(rows, key=lambda r: r["speedup"])
    worst = min(rows, key=lambda r: r["speedup"])

    def where(r: dict) -> str:
        return f"W={r['workers']}, {r['link_gbps']:g} Gbit/s, density {r['density']:g}"

    return (
        f"projection: switch / best peer all-reduce {worst['speedup']:.3g}x ({where(worst)}) "
        f"to {best['speedup']:.3g}x ({where(best)})"
    )


def _plot(args: argparse.Namespace, costs: Costs, pps: float) -> None:
    """The plot: the chosen costs, and this machine's calibrated eBPF (else reference
    switch) costs beside them when they are not the chosen ones and a calibration exists."""

    def speedup_of(c: Costs, p: float) -> Callable[[int, float, float], float]:
        def speedup(w: int, link: float, d: float) -> float:
            got = project(cluster_of(args, w, link, d, p), c)
            return got["peer"].seconds / got["switch"].seconds

        return speedup

    rows = [(_costs_title(args.costs, costs, pps), speedup_of(costs, pps))]
    if args.costs == "line-rate" and calibration.CALIBRATION_PATH.exists():
        record = calibration.load()
        target = "ebpf" if "ebpf" in record["targets"] else "refswitch"
        measured, pps_m = calibration.cluster_costs(record, target)
        rows.append((_costs_title(target, measured, pps_m), speedup_of(measured, pps_m)))
    links = sorted({1.0, *args.link_gbps})
    plot(rows, PLOT_WORKERS, links, args.density, plot_path(f"{args.name}.png"))


def _costs_title(name: str, costs: Costs, pps: float) -> str:
    if name == "line-rate":
        return f"line-rate hosts and switch\n(round trip {costs.rtt_s * 1e6:g} us)"
    return f"{name} as calibrated here\n(worker {costs.worker_packet_s * 1e6:.0f} us/packet" + (
        f", switch {pps:,.0f}/s)" if pps else ")"
    )


def _measure(args: argparse.Namespace) -> None:
    """--calibrate and --check: measure here (root), write the calibration and check."""
    from bench import projection_check
    from bench.aggregation import GlooPool
    from homagg.lab.switch_process import bmv2_available, ebpf_available

    targets = args.targets or ["refswitch"] + (["ebpf"] if ebpf_available() else [])
    # what forwarding a frame costs the software switches (gloo's frames cross them in
    # Mininet); BMv2 where installed
    forwarding = ["refswitch"] + (["bmv2"] if bmv2_available() else [])
    # BMv2 is calibrated for the Mininet runs, not checked here: ~3,500 contributions/s
    # would take W = 32's steps to minutes
    checked_targets = [t for t in targets if t != "bmv2"]
    n = args.check_elements
    small = [w for w in args.check_workers if w <= 8]
    # worlds above 8 at fewer elements, and W = 8 again beside them at that size
    large = [w for w in args.check_workers if w >= 8] if max(args.check_workers) > 8 else []
    worlds = tuple(sorted({2, 4, *args.check_workers}))
    gloo = GlooPool([calibration.GLOO_SMALL, n, LARGE_WORLDS_ELEMENTS], worlds=worlds)
    try:
        record = calibration.calibrate_passes(args.passes, targets, n, args.reps, gloo, forwarding)
        calibration.save(record)
        if not args.check:
            print("\n".join(calibration.describe(record)))
            return
        start, lines = time.perf_counter(), ["# Projection checked on this machine", ""]
        lines += calibration.describe(record)
        checked = []
        for elements, ws in ((n, small), (LARGE_WORLDS_ELEMENTS, large)):
            if ws:
                measured = {
                    t: projection_check.measure_switch(t, ws, elements, args.reps, gloo)
                    for t in checked_targets
                }
                rows = projection_check.rows(record, measured, elements)
                lines += projection_check.report(record, rows, elements)
                checked += rows
        lines.append(f"Summary: {projection_check.summary(checked)}.")
    finally:
        gloo.close()
    lines.insert(
        1,
        f"`python -m bench.projection {' '.join(sys.argv[1:])}`; the check ran in "
        f"{time.perf_counter() - start:.0f} s.\n",
    )
    publish(args.check_name, lines)


def _check_runs(args: argparse.Namespace) -> None:
    """--check-runs (and --start-runs): the model beside Mininet runs, published."""
    import os

    from bench import projection_runs as pr

    dirs = list(args.check_runs)
    if args.start_runs:
        from homagg.lab.namespace import have_privileges

        if not have_privileges():
            raise ModelError("--start-runs needs root (Mininet); --check-runs alone does not")
        if args.run_repeats < 1:
            raise ModelError(f"--run-repeats must be >= 1, not {args.run_repeats}")
        base = dirs.pop(0)
        for rep in range(args.run_repeats):  # the topologies alternate, repetition by repetition
            for topo in args.run_topos:
                spec = RunSpec(args.run_target, topo, args.run_steps, args.run_pool_size)
                suffix = f"-{rep + 1}" if args.run_repeats > 1 else ""
                dirs.append(start_run(base / f"{spec.name}{suffix}", spec))
    cores = args.run_cores or float(os.cpu_count() or 1)
    record = calibration.load()
    rows = [pr.row(pr.load_run(d), record, args.switch_pps or 0.0, cores) for d in dirs]
    lines = ["# Projection checked against Mininet training runs", ""]
    lines += [f"`python -m bench.projection {' '.join(sys.argv[1:])}`", ""]
    load = ", ".join(f"{x:.0f}" for x in os.getloadavg())
    lines += [f"Load average at the check (1, 5, 15 min): {load}, on {cores:g} cores.", ""]
    lines += calibration.describe(record)
    publish(args.runs_name, lines + pr.report(rows), pr.summary(rows))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check_runs:
        try:
            _check_runs(args)
        except ModelError as exc:
            print(f"bench.projection: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        if args.calibrate or args.check:
            from homagg.lab.namespace import have_privileges

            if not have_privileges():
                print("--calibrate and --check need root (network namespaces)", file=sys.stderr)
                return 1
            _measure(args)
        costs, pps = costs_and_switch(args)
        rows = table_rows(args, costs, pps)
    except ModelError as exc:
        print(f"bench.projection: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"costs": asdict(costs), "switch_pps": pps, "rows": rows}, indent=1))
    else:
        publish(args.name, report(args, costs, pps, rows))
    if not args.no_plot:
        _plot(args, costs, pps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
