"""First-try peeling failure rate of the lossless codec's count sketch with its default
sizing rule (worker/codecs/lossless.py sketch_rows, attempt 0), per union size and kind of
support, over many seeds: how often the codec needs its reseed attempt.

Supports: "uniform" (keys drawn uniformly from 2^31), "runs" (runs of 1..64 consecutive
indices, as a gradient's support clusters in a layer's rows and an embedding's blocks) and
"dense-prefix" (a contiguous range, the worst clustering). Writes bench/results/peeling.md.

    python -m bench.peeling [--trials 2000 1000 200] [--sizes 3000 10000 100000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from bench.publish import publish

KINDS = ("uniform", "runs", "dense-prefix")


def support(kind: str, keys: int, rng: np.random.Generator) -> np.ndarray:
    """A sorted union of `keys` distinct keys of the given kind."""
    if kind == "uniform":
        return np.sort(rng.choice(1 << 31, keys, replace=False))
    if kind == "dense-prefix":
        return np.arange(keys, dtype=np.int64) + int(rng.integers(0, 1 << 30))
    starts, total, parts = rng.integers(0, 1 << 30, keys), 0, []
    for s in starts:
        run = min(int(rng.integers(1, 65)), keys - total)
        parts.append(np.arange(s, s + run, dtype=np.int64))
        total += run
        if total >= keys:
            break
    u = np.unique(np.concatenate(parts))
    return u[:keys]


def failure_rate(kind: str, keys: int, trials: int, seed: int) -> tuple[int, int]:
    """(first-try failures, trials) with the default rows and seeds 0..trials-1."""
    from worker.codecs.count_sketch import SketchShape, plan_peeling
    from worker.codecs.lossless import sketch_rows

    rng = np.random.default_rng(seed)
    failures = 0
    for t in range(trials):
        u = support(kind, keys, rng)
        failures += plan_peeling(u, SketchShape(sketch_rows(u.size, 0), 1, t)) is None
    return failures, trials


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion k/n."""
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def main(argv: list[str] | None = None) -> int:
    """Measure every (size, kind) and write bench/results/peeling.md."""
    p = argparse.ArgumentParser(
        prog="python -m bench.peeling",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[3000, 10000, 100000])
    p.add_argument("--trials", type=int, nargs="+", default=[2000, 1000, 200])
    args = p.parse_args(argv)
    if len(args.sizes) != len(args.trials) or min(args.sizes + args.trials) < 1:
        p.error("give one positive --trials per positive --sizes entry")
    started = time.perf_counter()
    lines = [
        "# First-try peeling failures of the count sketch (default sizing rule)",
        "",
        "`python -m bench.peeling`: rows = sketch_rows(|U|, 0) (load ~0.81 at large |U|), "
        "3 hashes, one seed per trial; a failure costs the codec one reseed (attempt 2), "
        "never a second value phase. 95% Wilson interval.",
        "",
        "| keys | support | trials | failures | rate | 95% interval |",
        "|--:|---|--:|--:|--:|---|",
    ]
    rates = []
    for keys, trials in zip(args.sizes, args.trials):
        for kind in KINDS:
            k, n = failure_rate(kind, keys, trials, seed=keys)
            lo, hi = wilson(k, n)
            rates.append(k / n)
            lines.append(f"| {keys:,} | {kind} | {n} | {k} | {k / n:.2%} | {lo:.2%} .. {hi:.2%} |")
            print(lines[-1], flush=True)
    lines += ["", f"Ran in {time.perf_counter() - started:.0f} s."]
    publish("peeling", lines, summary=f"first-try peeling failure {max(rates):.2%} at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
