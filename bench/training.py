"""Per-iteration training time, W = 4, of the sparse model of `make run` (NCF) and of a
small dense model (MLP): DDP over gloo vs DDP with the homagg hook through the switch
(lossless and dense fixed point).

It reuses `python -m run` (Mininet, controller, torchrun; see docs/run.md) with fewer
steps and reads the per-step records rank 0 writes to {switch,gloo}.jsonl. Each round
runs, per model, the lossless job (then, in the same Mininet, its gloo twin) and the
fixed-point job; rounds alternate the codecs. Times are iteration times of every step
but the first of each run: median [p10, p90] over the steps of all rounds.

    python -m bench.training [--steps 15] [--rounds 2] [--target auto] [--models ncf,mlp]
                             [--codecs lossless,fixed_point,lowbit16,lowbit8]

The first codec's run also runs its gloo twin; the others run without.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.publish import plot_path, publish, pyplot
from bench.runs import RunSpec, run_once


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


DESCRIPTION = {
    "ncf": "NCF (sparse)",
    "mlp": "MLP (dense)",
}
DETAILS = {
    "ncf": "NCF of `make run` (20,000 x 16 and 4,000 x 16 embeddings and a small MLP: 1.5 MB of "
    "float32 gradients per step, ~1,300 rows touched by the 4 ranks together)",
    "mlp": "the dense MLP of `python -m run --model mlp` (64-256-256-10: 85k parameters, 340 kB of "
    "float32 gradients per step, all nonzero)",
}
RUNS = ("DDP over gloo", "switch, lossless", "switch, fixed_point")


def run_round(
    model: str, codec: str, no_gloo: bool, args: argparse.Namespace, out: Path
) -> tuple[dict, str]:
    """One `python -m run`: {run name: step records} and the switch target it used."""
    spec = RunSpec(
        model,
        codec,
        hosts=args.hosts,
        steps=args.steps,
        gloo=not no_gloo,
        target=args.target,
        timeout=args.timeout,
    )
    return run_once(spec, out)


def plot(
    samples: dict[tuple[str, str], list[float]],
    models: list[str],
    title: str,
    path: Path,
    runs: tuple[str, ...] = RUNS,
) -> None:
    """Median iteration time per model and run, with p10-p90 whiskers, log scale."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(runs)
    colors = ("0.4", "tab:green", "tab:blue", "tab:orange", "tab:red", "tab:purple")
    for j, (name, color) in enumerate(zip(runs, colors)):
        xs = [i + (j - (len(runs) - 1) / 2) * width for i in range(len(models))]
        med = [statistics.median(samples[(m, name)]) * 1e3 for m in models]
        lo = [med[i] - _pct(samples[(m, name)], 0.1) * 1e3 for i, m in enumerate(models)]
        hi = [_pct(samples[(m, name)], 0.9) * 1e3 - med[i] for i, m in enumerate(models)]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, color=color, label=name)
    ax.set_xticks(range(len(models)), [DESCRIPTION[m] for m in models])
    ax.set_yscale("log")
    ax.set_ylabel("ms per iteration (median, p10-p90)")
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--models", default="ncf,mlp", help="comma-separated: ncf, mlp")
    p.add_argument("--target", default="auto", choices=["auto", "bmv2", "refswitch"])
    p.add_argument("--timeout", type=float, default=300, help="seconds per `python -m run`")
    p.add_argument(
        "--codecs",
        default="lossless,fixed_point",
        help="comma-separated switch codecs (python -m run --codec); the first one's run "
        "also runs DDP over gloo",
    )
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    codec_names = [c for c in args.codecs.split(",") if c]
    if not codec_names:
        p.error("--codecs needs at least one codec")
    runs_named = ("DDP over gloo", *(f"switch, {c}" for c in codec_names))
    if not models or any(m not in DESCRIPTION for m in models):
        p.error(f"--models takes a comma-separated list of {', '.join(DESCRIPTION)}")
    start = time.perf_counter()
    samples: dict[tuple[str, str], list[float]] = {}
    wire: dict[tuple[str, str], list[float]] = {}
    target_used = args.target
    with tempfile.TemporaryDirectory(prefix="homagg-bench-train-") as tmp:
        for rnd in range(args.rounds):
            for model in models:
                order = [(c, i > 0) for i, c in enumerate(codec_names)]
                if rnd % 2:
                    order.reverse()
                for codec, no_gloo in order:
                    print(
                        f"  training round {rnd + 1}/{args.rounds}: "
                        f"python -m run --model {model} --codec {codec}"
                        f"{' --no-gloo' if no_gloo else ''} --steps {args.steps}",
                        flush=True,
                    )
                    t0 = time.perf_counter()
                    runs, target_used = run_round(
                        model, codec, no_gloo, args, Path(tmp) / f"{model}-{codec}-{rnd}"
                    )
                    for name, steps in runs.items():
                        samples.setdefault((model, name), []).extend(
                            s["seconds"] for s in steps[1:]
                        )
                        wire.setdefault((model, name), []).extend(
                            s["tx_bytes"] / s["dense_bytes"] for s in steps
                        )
                    print(
                        f"    done in {time.perf_counter() - t0:.0f} s: "
                        + ", ".join(
                            f"{n} median "
                            f"{statistics.median(s['seconds'] for s in steps[1:]) * 1e3:.0f} ms"
                            for n, steps in runs.items()
                        ),
                        flush=True,
                    )
    lines = [
        f"# Training iteration time ({platform.machine()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m bench.training --steps {args.steps} --rounds {args.rounds} "
        f"--models {','.join(models)}`; ran in {time.perf_counter() - start:.0f} s. "
        f"`python -m run` (Mininet, {args.hosts} hosts, switch {target_used}, unshaped "
        "links). Iteration time of every step but each run's first: median "
        f"[p10, p90] over {args.rounds} x {args.steps - 1} steps; wire = bytes rank 0's "
        "host sent per "
        "step (everything: aggregation, gloo, control) / dense gradient bytes.",
        "",
    ]
    lines += [f"- {DESCRIPTION[m]}: {DETAILS[m]}." for m in models]
    lines += [
        "",
        "| W | model | run | ms/iteration | gloo / run | wire vs dense |",
        "|---:|---|---|---:|---:|---:|",
    ]
    parts = []
    for model in models:
        gloo = statistics.median(samples[(model, "DDP over gloo")])
        for name in runs_named:
            s = samples[(model, name)]
            med = statistics.median(s)
            lines.append(
                f"| {args.hosts} | {DESCRIPTION[model]} | {name} | {med * 1e3:.0f} "
                f"[{_pct(s, 0.1) * 1e3:.0f}, "
                f"{_pct(s, 0.9) * 1e3:.0f}] | {gloo / med:.2f}x | "
                f"{statistics.mean(wire[(model, name)]):.2f}x |"
            )
        speed = {c: gloo / statistics.median(samples[(model, f"switch, {c}")]) for c in codec_names}
        names = {"lossless": "lossless", "fixed_point": "fixed point"}
        part = f"{model}: " + ", ".join(f"{names.get(c, c)} {v:.2f}x" for c, v in speed.items())
        if model == "ncf" and "lossless" in speed:
            part += f" (target lossless >= 4x: {'MET' if speed['lossless'] >= 4 else 'MISSED'})"
        parts.append(part)
    summary = f"training W={args.hosts} ({target_used}), speed vs DDP over gloo: " + "; ".join(
        parts
    )
    lines += ["", f"Summary: {summary}.", ""]
    lines += ["![training iteration time](training.png)", ""]
    plot(
        samples,
        models,
        f"training, W={args.hosts}, {target_used}",
        plot_path("training.png"),
        runs_named,
    )
    publish("training", lines, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
