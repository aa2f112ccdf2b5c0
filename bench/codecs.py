"""Codec benchmark: CPU cost of the lossless codec vs one torch.topk, cells sent vs dense,
and the first-try peeling success rate vs the sketch's load factor.

Timed codecs and torch.topk alternate repetition by repetition, so that a noisy
neighbour hits them alike; tables give the median and [min, max] over repetitions.
W workers run in lockstep in one process (homagg/worker/codecs/simulate.py) to record the
switch's results; per-worker costs are then timed on one worker alone, fed those results,
split at the value phase.

    python -m bench.codecs [--n 25000000] [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.publish import heading, plot_path, publish, pyplot
from homagg.worker.codecs.base import Codec, Phase

# Pause before each timed item: torch's OpenMP threads keep spinning for a while after an
# op returns and would steal the cores from whatever is timed next.
SETTLE = 0.3


def sparse_inputs(
    rng: np.random.Generator, n: int, world_size: int, density: float, shared: bool = False
) -> list[np.ndarray]:
    """Per worker a float32 gradient with `density` nonzeros (independent supports, or the
    same support on every worker)."""
    k = max(1, int(n * density))
    common = rng.choice(n, k, replace=False) if shared else None
    xs = []
    for _ in range(world_size):
        x = np.zeros(n, np.float32)
        idx = common if shared else rng.choice(n, k, replace=False)
        x[idx] = rng.standard_normal(k).astype(np.float32)
        xs.append(x)
    return xs


def _fmt(values: list[float], scale: float = 1e3, digits: int = 0) -> str:
    med = statistics.median(values) * scale
    low, high = min(values) * scale, max(values) * scale
    return f"{med:,.{digits}f} [{low:,.{digits}f}, {high:,.{digits}f}]"


def record(codecs: list, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Run W workers in lockstep once; return the combined result of every phase."""
    from homagg.worker.codecs import simulate

    results: list[np.ndarray] = []

    def observe(step, phase, combined):
        results.append(combined.copy())
        return combined

    simulate(codecs, xs, tamper=observe)
    return results


def replay(codec, x: np.ndarray, results: list[np.ndarray]) -> tuple[float, float, float, float]:
    """One worker alone, fed the recorded switch results: (encode s, decode s, user CPU s,
    sys CPU s). Encode = every step until the last phase is sent, decode = after its
    result; as on a real worker, no other worker's buffers share the process."""
    feed = [r.copy() for r in results]
    gen = codec.aggregate(x)
    before = resource.getrusage(resource.RUSAGE_SELF)
    steps = []
    start = time.perf_counter()
    next(gen)
    steps.append(time.perf_counter() - start)
    for i, result in enumerate(feed):
        start = time.perf_counter()
        try:
            gen.send(result)
        except StopIteration:
            assert i == len(feed) - 1
        steps.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (
        sum(steps[:-1]),
        steps[-1],
        after.ru_utime - before.ru_utime,
        after.ru_stime - before.ru_stime,
    )


SPEED_MODES = ("sketch", "ranked")  # the lossless codec's value modes
SPEED_PARTS = ("encode", "decode", "total", "user", "sys")


def bench_speed(n: int, world_size: int, density: float, reps: int) -> tuple[list[str], dict]:
    """Per-worker encode/decode of the lossless codec (both value modes) vs torch.topk:
    (the results' lines, the medians in ms)."""
    res, ratios = _speed_samples(n, world_size, density, reps)
    lines = _speed_table(res, ratios, n, world_size, density, reps)
    return lines, {
        "topk_ms": statistics.median(res["topk"]) * 1e3,
        **{m: statistics.median(res[m + " total"]) * 1e3 for m in SPEED_MODES},
    }


def _speed_samples(
    n: int, world_size: int, density: float, reps: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per repetition ("topk", "topk dense", "<mode> <part>") and the top-k /
    codec time ratios per mode, alternating the methods in each repetition."""
    import torch

    from homagg.worker.codecs import LosslessSparse

    rng = np.random.default_rng(1)
    xs = sparse_inputs(rng, n, world_size, density)
    k = int(n * density)
    absx = torch.from_numpy(xs[0]).abs()
    dense_abs = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).abs()
    modes = SPEED_MODES
    recorded = {m: record([LosslessSparse(world_size, values=m) for _ in xs], xs) for m in modes}
    res: dict[str, list[float]] = {"topk": [], "topk dense": []}
    for mode in modes:
        for part in SPEED_PARTS:
            res[f"{mode} {part}"] = []
    ratios: dict[str, list[float]] = {m: [] for m in modes}

    def run(mode: str, rank: int) -> None:
        enc, dec, user, sys_ = replay(
            LosslessSparse(world_size, values=mode), xs[rank], recorded[mode]
        )
        for part, value in zip(SPEED_PARTS, (enc, dec, enc + dec, user, sys_), strict=True):
            res[f"{mode} {part}"].append(value)

    for mode in modes:  # warm-up: first-touch page faults of the process's heap
        replay(LosslessSparse(world_size, values=mode), xs[0], recorded[mode])
    torch.topk(absx, k)
    for rep in range(reps):
        for name, tensor in (("topk", absx), ("topk dense", dense_abs)):
            time.sleep(SETTLE)
            start = time.perf_counter()
            torch.topk(tensor, k)
            res[name].append(time.perf_counter() - start)
        for mode in modes:
            time.sleep(SETTLE)
            run(mode, rep % world_size)
            ratios[mode].append(res["topk"][-1] / res[f"{mode} total"][-1])
        print(
            f"  speed rep {rep + 1}/{reps}: topk {res['topk'][-1] * 1e3:.0f} ms, "
            f"topk dense {res['topk dense'][-1] * 1e3:.0f} ms, "
            + ", ".join(f"{m} {res[m + ' total'][-1] * 1e3:.0f} ms" for m in modes),
            flush=True,
        )
    return res, ratios


def _speed_table(
    res: dict[str, list[float]],
    ratios: dict[str, list[float]],
    n: int,
    world_size: int,
    density: float,
    reps: int,
) -> list[str]:
    """The markdown section of the speed samples."""
    k = int(n * density)
    lines = [
        f"### CPU per worker: {n:,} float32, {density:.0%} nonzeros per worker, W = {world_size}",
        "",
        f"Independent supports (union ~{1 - (1 - density) ** world_size:.1%} of n). "
        "W workers ran once in lockstep to record the switch's results; each repetition "
        "then times one worker alone (rank = rep mod W) fed those results. Encode = "
        "every step until the value phase is sent (for `sketch` this includes the "
        "peeling plan over the union); decode = after the value phase's result. "
        f"ms, median [min, max] of {reps} alternating repetitions; user / sys = that "
        "worker's process CPU (the kernel's share: page faults of fresh buffers).",
        "",
        "| what | encode ms | decode ms | total ms | user / sys CPU ms | "
        "torch.topk (same x) / total |",
        "|---|---:|---:|---:|---:|---:|",
        f"| torch.topk(abs(x), k={k:,}), x the same 1%-dense tensor | | | "
        f"{_fmt(res['topk'])} | | 1 |",
        f"| torch.topk(abs(g), k={k:,}), g a dense N(0,1) tensor (what a top-k "
        f"sparsifier selects from) | | | {_fmt(res['topk dense'])} | | |",
    ]
    for mode in SPEED_MODES:
        cpu = (
            f"{statistics.median(res[mode + ' user']) * 1e3:,.0f} / "
            f"{statistics.median(res[mode + ' sys']) * 1e3:,.0f}"
        )
        lines.append(
            f"| lossless, values={mode} | {_fmt(res[mode + ' encode'])} | "
            f"{_fmt(res[mode + ' decode'])} | {_fmt(res[mode + ' total'])} | {cpu} | "
            f"{_fmt(ratios[mode], 1, 2)}x |"
        )
    return lines


def bench_cells(n: int, world_size: int, densities: list[float]) -> list[str]:
    """Cells each worker sends per step, by phase, relative to the n cells of a dense ADD;
    every lossless run is checked bit for bit against the dense fixed-point sum."""
    from homagg.worker.codecs import CLTK, FixedPoint, LosslessSparse, simulate

    rng = np.random.default_rng(2)
    lines = [
        f"### Cells sent per worker per step, n = {n:,}, W = {world_size}",
        "",
        "Phases as `op x cells`; ratio = all cells / n (a dense fixed-point step sends "
        "n + blocks + 1). Every lossless result was checked equal, bit for bit, to the "
        "dense fixed-point sum.",
        "",
        "| density per worker | supports | union/n | codec | phases | cells / n |",
        "|---:|---|---:|---|---|---:|",
    ]
    for density in densities:
        for shared in (False, True):
            xs = sparse_inputs(rng, n, world_size, density, shared=shared)
            union = np.count_nonzero(np.any(np.array(xs) != 0, axis=0)) / n
            dense = simulate([FixedPoint(world_size) for _ in xs], xs)[0]
            runs: list[tuple[str, list[Codec]]] = [
                ("lossless sketch", [LosslessSparse(world_size, values="sketch") for _ in xs]),
                ("lossless ranked", [LosslessSparse(world_size, values="ranked") for _ in xs]),
                (
                    f"CLT-k ratio {density:g}",
                    [CLTK(world_size, r, ratio=density) for r in range(world_size)],
                ),
            ]
            for name, codecs in runs:
                log: list[Phase] = []
                out = simulate(codecs, xs, phases_log=log)[0]
                if name.startswith("lossless"):
                    assert np.array_equal(out.view(np.int32), dense.view(np.int32)), name
                phases = " + ".join(f"{p.op.name} x {p.cells.size:,}" for p in log)
                total = sum(p.cells.size for p in log)
                lines.append(
                    f"| {density:.1%} | {'same' if shared else 'independent'} | "
                    f"{union:.2%} | {name} | {phases} | {total / n:.4f} |"
                )
            del xs, dense
    return lines


def bench_rows(world_size: int) -> list[str]:
    """Element vs block-granular support for a row-sparse (embedding) gradient."""
    from homagg.worker.codecs import LosslessSparse, simulate

    rng = np.random.default_rng(3)
    rows, dim = 200_000, 64
    xs = []
    for _ in range(world_size):
        x = np.zeros((rows, dim), np.float32)
        touched = rng.choice(rows, rows // 100, replace=False)
        x[touched] = rng.standard_normal((touched.size, dim))
        xs.append(x)
    n = rows * dim
    lines = [
        f"### Row-sparse gradient: {rows:,} x {dim} embedding, 1% rows per worker, "
        f"W = {world_size}",
        "",
        "| support | phases | cells / n |",
        "|---|---|---:|",
    ]
    for name, block in (("per element", 1), (f"per row ({dim} elements)", dim)):
        log: list[Phase] = []
        simulate([LosslessSparse(world_size, support_block=block) for _ in xs], xs, phases_log=log)
        phases = " + ".join(f"{p.op.name} x {p.cells.size:,}" for p in log)
        lines.append(f"| {name} | {phases} | {sum(p.cells.size for p in log) / n:.4f} |")
    return lines


def bench_peeling(loads: np.ndarray, sizes: dict[int, int]) -> tuple[list[str], dict]:
    """First-try peeling success rate vs load |U| / rows, over random seeds."""
    from homagg.worker.codecs.count_sketch import SketchShape, plan_peeling

    rng = np.random.default_rng(4)
    rates: dict[int, list[float]] = {}
    for keys, trials in sizes.items():
        rates[keys] = []
        for load in loads:
            rows = 3 * max(1, round(keys / load / 3))
            ok = 0
            for t in range(trials):
                u = np.sort(rng.choice(1 << 31, keys, replace=False))
                ok += plan_peeling(u, SketchShape(rows, 1, t)) is not None
            rates[keys].append(ok / trials)
        print(f"  peeling {keys:,} keys done", flush=True)
    head = "| load |U|/rows | " + " | ".join(f"{k:,} keys ({t} trials)" for k, t in sizes.items())
    lines = [
        "### First-try peeling success vs load (3 hashes, partitioned rows)",
        "",
        "The 3-hypergraph 2-core threshold is ~0.818; the codec sizes rows = 1.23 |U| + "
        "sqrt(|U|) + 16 (load ~0.81 for large unions, lower for small ones) and retries "
        "locally (another seed, then x1.5) before any value phase is sent.",
        "",
        head + " |",
        "|---:|" + "---:|" * len(sizes),
    ]
    for i, load in enumerate(loads):
        lines.append(f"| {load:.3f} | " + " | ".join(f"{rates[k][i]:.2f}" for k in sizes) + " |")
    return lines, rates


def plot_peeling(loads: np.ndarray, rates: dict[int, list[float]], path: Path) -> None:
    """PNG of the success-rate curves with the threshold marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for keys, r in rates.items():
        ax.plot(loads, r, marker="o", markersize=3, label=f"|U| = {keys:,}")
    ax.axvline(0.818, color="grey", linestyle="--", label="threshold 0.818")
    ax.set_xlabel("load |U| / rows")
    ax.set_ylabel("first-try peeling success")
    ax.set_title("Count-sketch peeling (3 hashes)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench/results/codecs.md and peel_threshold.png."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=25_000_000)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = p.parse_args(argv)
    n, reps = (1_000_000, 2) if args.quick else (args.n, args.reps)
    started = time.perf_counter()
    speed, _ = bench_speed(n, args.world_size, 0.01, reps)
    cells = bench_cells(n, args.world_size, [0.001, 0.01, 0.1])
    row_lines = bench_rows(args.world_size)
    # coarse far from the ~0.818 threshold, fine around it
    loads = np.r_[np.arange(0.5, 0.751, 0.05), np.arange(0.76, 0.8601, 0.01), 0.9, 0.95, 1.0].round(
        3
    )
    sizes = (
        {1_000: 40, 10_000: 20, 100_000: 5} if args.quick else {1_000: 200, 10_000: 50, 100_000: 10}
    )
    peel, rates = bench_peeling(loads, sizes)
    plot_peeling(loads, rates, plot_path("peel_threshold.png"))
    import torch

    lines = [
        heading("Codec benchmark", f"numpy {np.__version__}", f"torch {torch.__version__}"),
        "",
        "`python -m bench.codecs`"
        + (" --quick" if args.quick else "")
        + f"; ran in {time.perf_counter() - started:.0f} s. Plot: peel_threshold.png.",
        "",
        *speed,
        "",
        *cells,
        "",
        *row_lines,
        "",
        *peel,
    ]
    publish("codecs", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
