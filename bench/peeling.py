"""First-try peeling failure rate of the lossless codec's count sketch with its default
sizing rule (homagg/worker/codecs/lossless.py sketch_rows, attempt 0), per union size and kind of
support, over many seeds: how often the codec needs its reseed attempt.

Supports: "uniform" (keys drawn uniformly from 2^31), "runs" (runs of 1..64 consecutive
indices, as a gradient's support clusters in a layer's rows and an embedding's blocks) and
"dense-prefix" (a contiguous range, the worst clustering); and real ones: the union over
W = 4 ranks of the rows whose gradient is nonzero in `make run`'s NCF (run/model.py, user
and item tables; the lossless codec's keys with support_block = the embedding width), step
after step of its training (SGD on the ranks' mean gradient, as DDP does), each tried with
--ncf-seeds hash seeds from 0 (the codec's default). Writes bench/results/peeling.md.

    python -m bench.peeling [--trials 2000 1000 200] [--sizes 3000 10000 100000]
                            [--ncf-steps 300] [--ncf-seeds 10]
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
    from homagg.worker.codecs.count_sketch import SketchShape, plan_peeling
    from homagg.worker.codecs.lossless import sketch_rows

    rng = np.random.default_rng(seed)
    failures = 0
    for t in range(trials):
        u = support(kind, keys, rng)
        failures += plan_peeling(u, SketchShape(sketch_rows(u.size, 0), 1, t)) is None
    return failures, trials


def ncf_supports(steps: int, world_size: int = 4) -> dict[str, list[np.ndarray]]:
    """Per embedding table ("users", "items"), the union over `world_size` ranks of the rows with
    a nonzero gradient at each of `steps` training steps of run/model.py's NCF."""
    import torch

    from run.model import DEFAULT_LR, NCF, JobShape, make_task

    task = make_task("ncf", JobShape())
    model = task.model
    assert isinstance(model, NCF)
    tables = {"users": model.user.weight, "items": model.item.weight}
    params = list(model.parameters())
    out: dict[str, list[np.ndarray]] = {name: [] for name in tables}
    for step in range(steps):
        sums = [torch.zeros_like(p) for p in params]
        rows: dict[str, list[np.ndarray]] = {name: [] for name in tables}
        for rank in range(world_size):
            model.zero_grad()
            *inputs, labels = task.batch(rank, step)
            task.loss(model(*inputs), labels).backward()
            for total, p in zip(sums, params):
                assert p.grad is not None
                total += p.grad.to_dense()
            for name, weight in tables.items():
                assert weight.grad is not None
                g = weight.grad.coalesce()
                nonzero = g.values().abs().sum(1) > 0
                rows[name].append(g.indices()[0][nonzero].numpy())
        for name in tables:  # the OR of the ranks' bitmaps: the codec's union
            out[name].append(np.unique(np.concatenate(rows[name])))
        with torch.no_grad():
            for total, p in zip(sums, params):
                p.sub_(DEFAULT_LR["ncf"] / world_size * total)
    return out


def ncf_failures(supports: list[np.ndarray], seeds: int) -> tuple[int, int]:
    """(first-try failures, trials): each support with hash seeds 0..seeds-1."""
    from homagg.worker.codecs.count_sketch import SketchShape, plan_peeling
    from homagg.worker.codecs.lossless import sketch_rows

    failures = 0
    for u in supports:
        for seed in range(seeds):
            failures += plan_peeling(u, SketchShape(sketch_rows(u.size, 0), 1, seed)) is None
    return failures, len(supports) * seeds


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion k/n."""
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def ncf_rows(steps: int, seeds: int, rates: list[float]) -> list[str]:
    """The table of the NCF's real supports (appends each rate to `rates`)."""
    lines = [
        "",
        f"Real supports: `make run`'s NCF, W = 4 ranks, {steps} training steps, the union "
        "per step of the rows with a nonzero gradient (the codec's keys), "
        f"each with hash seeds 0..{seeds - 1} (0: the codec's default).",
        "",
        "| table | union size, median [min, max] | trials | failures | rate | 95% interval "
        "| seed 0 only |",
        "|---|---|--:|--:|--:|---|---|",
    ]
    for table, supports in ncf_supports(steps).items():
        sizes = [u.size for u in supports]
        k, n = ncf_failures(supports, seeds)
        k0, n0 = ncf_failures(supports, 1)
        lo, hi = wilson(k, n)
        rates.append(k / n)
        lines.append(
            f"| {table} | {int(np.median(sizes))} [{min(sizes)}, {max(sizes)}] | {n} | {k} "
            f"| {k / n:.2%} | {lo:.2%} .. {hi:.2%} | {k0} of {n0} |"
        )
        print(lines[-1], flush=True)
    return lines


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
    p.add_argument("--ncf-steps", type=int, default=300, help="NCF steps (0: none)")
    p.add_argument("--ncf-seeds", type=int, default=10, help="hash seeds per NCF support")
    args = p.parse_args(argv)
    if len(args.sizes) != len(args.trials) or min(args.sizes + args.trials) < 1:
        p.error("give one positive --trials per positive --sizes entry")
    if args.ncf_steps < 0 or args.ncf_seeds < 1:
        p.error("--ncf-steps must be >= 0 and --ncf-seeds positive")
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
    if args.ncf_steps:
        lines += ncf_rows(args.ncf_steps, args.ncf_seeds, rates)
    lines += ["", f"Ran in {time.perf_counter() - started:.0f} s."]
    publish("peeling", lines, summary=f"first-try peeling failure {max(rates):.2%} at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
