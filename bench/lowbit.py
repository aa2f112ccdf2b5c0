"""Convergence with low-bit lanes through the real path: `python -m run` (Mininet, the
switch, the controller, torchrun; W = 4) trains the dense MLP and the transformer LM with
DDP over gloo and with the homagg hook through the switch: 16-bit lanes, and 8-bit lanes
with error feedback (gamma 0.9, the registry's default) and without (gamma=0), each with
the codec's stochastic rounding and with rounding to nearest; same data, seed, learning
rate and steps for every run. Reported: the training loss per step (rank 0's records, mean
over the ranks), the final loss (mean of the last tenth of the steps) against gloo's, and
the target "16-bit lanes within 1% of gloo's loss after the same steps", judged per model.

    python -m bench.lowbit [--models mlp,lm] [--steps N] [--rounds 1] [--target auto]
        [--name lowbit]

Why this task (REGIMES): with `make run`'s defaults every lane codec lands on gloo's curve
(within 0.2% after 300 steps, bit for bit the switch's sums in one process), because
stochastic rounding is unbiased: it only adds variance, at most a quantum 2^(E-P) per
element and worker (P = 5 magnitude bits for 8-bit lanes at W = 4, docs/codecs.md), and
measured on these models that noise is ~0.1x the minibatch noise of the same element, so
feedback has nothing to correct. Two changes make the quantizer matter: one exponent per
128 Ki elements (codec option block=131072: the whole gradient shares the exponent of its
largest element, as with one scale per tensor; the median element is then ~50x below it,
within a few quanta of zero), and the rows rounding to nearest (rounding=nearest), a
biased quantizer that drops every element below half a quantum, step after step: the
error feedback exists for that one (CO3). Learning rate, batch and steps stay `make run`'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.publish import heading, plot_path, publish, pyplot
from bench.runs import RunFailed, RunSpec, note_failure, run_once, smoothed
from homagg.lab.switch_process import AUTO_TARGET, TARGETS

GLOO = "DDP over gloo"


@dataclass(frozen=True)
class Regime:
    """How one model trains in this benchmark (python -m run --steps --lr --batch) and the
    lane codecs' options beside gamma."""

    steps: int
    lr: float
    batch: int
    options: list[str] = field(default_factory=list)


REGIMES = {
    "mlp": Regime(steps=300, lr=0.1, batch=64, options=["block=131072"]),
    "lm": Regime(steps=300, lr=0.5, batch=64, options=["block=131072"]),
}
# (row name, codec, extra codec options)
RUNS: tuple[tuple[str, str, list[str]], ...] = (
    ("16-bit lanes + EF", "lowbit16", []),
    ("8-bit lanes + EF", "lowbit8", []),
    ("8-bit lanes, no EF", "lowbit8", ["gamma=0"]),
    ("8-bit nearest + EF", "lowbit8", ["rounding=nearest"]),
    ("8-bit nearest, no EF", "lowbit8", ["rounding=nearest", "gamma=0"]),
)
DESCRIPTION = {"mlp": "MLP (dense)", "lm": "transformer LM (dense)"}
GOAL = 0.01  # 16-bit lanes: final loss within 1% of gloo's


def final_loss(losses: list[float]) -> float:
    """Mean training loss of the last tenth of the steps (at least 5)."""
    return statistics.mean(losses[-max(5, len(losses) // 10) :])


def specs(model: str, args: argparse.Namespace) -> list[tuple[str, RunSpec]]:
    """The runs of one model: every lane codec; the first also runs DDP over gloo."""
    r = args.regime[model]
    return [
        (
            name,
            RunSpec(
                model,
                codec,
                hosts=args.hosts,
                steps=r.steps,
                gloo=i == 0,
                target=args.target,
                codec_options=[*r.options, *extra],
                lr=r.lr,
                batch=r.batch,
            ),
        )
        for i, (name, codec, extra) in enumerate(RUNS)
    ]


def train(model: str, args: argparse.Namespace, tmp: Path, curves: dict, times: dict) -> str:
    """Every run of one model, one round: its loss curves and iteration seconds."""
    target = args.target
    for name, spec in specs(model, args):
        t0 = time.perf_counter()
        out = tmp / f"{model}-{len(curves.get((model, name), []))}-{name.replace(' ', '')}"
        try:
            runs, target = run_once(spec, out)
        except RunFailed as exc:
            note_failure(args.failed, f"{model}, {name}", exc)
            continue
        for run, steps in runs.items():
            row = name if run == spec.switch_run else run
            curves.setdefault((model, row), []).append([s["loss"] for s in steps])
            times.setdefault((model, row), []).extend(s["seconds"] for s in steps[1:])
        got = final_loss(curves[(model, name)][-1])
        print(f"  {model} {name}: final loss {got:.4f} ({time.perf_counter() - t0:.0f} s)")
    return target


def mean_curve(runs: list[list[float]]) -> list[float]:
    """The rounds' loss curves averaged step by step."""
    return [statistics.mean(step) for step in zip(*runs)]


def verdicts(model: str, curves: dict) -> tuple[list[str], str]:
    """The table rows of one model and its part of the summary line."""
    gloo = final_loss(mean_curve(curves[(model, GLOO)]))
    rows, diff = [], {}
    for name in (GLOO, *(n for n, _, _ in RUNS)):
        got = final_loss(mean_curve(curves[(model, name)]))
        diff[name] = got / gloo - 1
        rows.append(f"| {DESCRIPTION[model]} | {name} | {got:.4f} | {100 * diff[name]:+.2f}% |")
    d16 = diff["16-bit lanes + EF"]
    verdict = "MET" if abs(d16) <= GOAL else "MISSED"
    part = (
        f"{model}: 16-bit {100 * d16:+.2f}% (target within {GOAL:.0%} of gloo: {verdict}), "
        f"8-bit {100 * diff['8-bit lanes + EF']:+.2f}% / without feedback "
        f"{100 * diff['8-bit lanes, no EF']:+.2f}%, 8-bit rounding to nearest "
        f"{100 * diff['8-bit nearest + EF']:+.2f}% / without feedback "
        f"{100 * diff['8-bit nearest, no EF']:+.2f}%"
    )
    return rows, part


def plot(models: list[str], curves: dict, path: Path, title: str) -> None:
    """Per model: the smoothed loss per step (top) and its difference to gloo's (bottom)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 6.4), squeeze=False)
    names = [GLOO, *(n for n, _, _ in RUNS)]
    palette = ("0.3", "tab:green", "tab:blue", "tab:cyan", "tab:orange", "tab:red")
    colors = dict(zip(names, palette))
    for j, model in enumerate(models):
        gloo = smoothed(mean_curve(curves[(model, GLOO)]), 10)
        for name in names:
            curve = smoothed(mean_curve(curves[(model, name)]), 10)
            x = range(1, len(curve) + 1)
            axes[0][j].plot(x, curve, label=name, color=colors[name], lw=1.2)
            rel = [100 * (c / g - 1) for c, g in zip(curve, gloo)]
            axes[1][j].plot(x, rel, label=name, color=colors[name], lw=1.2)
        axes[0][j].set(
            ylabel="training loss (10-step mean)", yscale="log", title=DESCRIPTION[model]
        )
        axes[1][j].set(xlabel="step", ylabel="vs DDP over gloo (%)")
        for ax in axes[:, j]:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(
    models: list[str], args: argparse.Namespace, curves: dict, times: dict, **run: Any
) -> None:
    """bench/results/<name>.md and .png (the models whose every run succeeded; the
    others' failed runs are listed under the table)."""
    names = [GLOO, *(n for n, _, _ in RUNS)]
    models = [m for m in models if all((m, n) in curves for n in names)]
    if not models:
        publish(
            args.name,
            ["# Convergence with low-bit lanes: no model's runs all ran"],
            None,
            args.failed,
        )
        return
    lines = [
        heading("Convergence with low-bit lanes"),
        "",
        f"`python -m bench.lowbit --models {','.join(models)} --rounds {args.rounds}`; ran in "
        f"{run['seconds']:.0f} s; `python -m run` (Mininet, {args.hosts} hosts, switch "
        f"{run['target']}). Final loss: mean training loss of the last tenth of the steps "
        "(mean over the ranks, and over the rounds); every run has the same data, "
        "initialisation, learning rate and steps; EF = error feedback, gamma 0.9 (no EF: "
        "--codec-option gamma=0); the lanes round stochastically (unbiased) but in the "
        "nearest rows (rounding=nearest, biased). Regimes (why these: `python -m "
        "bench.lowbit --help`):",
        "",
        *(
            f"- {DESCRIPTION[m]}: {r.steps} steps, lr {r.lr:g}, batch {r.batch} per rank, "
            f"lane codec options {' '.join(r.options) or 'none'}."
            for m, r in ((m, args.regime[m]) for m in models)
        ),
        "",
        "| model | run | final loss | vs gloo |",
        "|---|---|---:|---:|",
    ]
    parts = []
    for model in models:
        rows, part = verdicts(model, curves)
        lines += rows
        parts.append(part)
    lines += [
        "",
        "Median iteration time (ms): "
        + "; ".join(
            f"{DESCRIPTION[m]} "
            + ", ".join(
                f"{n} {statistics.median(times[(m, n)]) * 1e3:.0f}"
                for n in (GLOO, *(x for x, _, _ in RUNS))
            )
            for m in models
        )
        + ".",
    ]
    summary = "low-bit lanes, loss vs gloo after the same steps: " + "; ".join(parts)
    lines += ["", f"Summary: {summary}.", "", f"![training loss]({args.name}.png)", ""]
    title = f"W={args.hosts}, {run['target']}: loss per step, and its difference to gloo's"
    plot(models, curves, plot_path(f"{args.name}.png"), title)
    publish(args.name, lines, summary, args.failed)


def main(argv: list[str] | None = None) -> int:
    """Train every model with every run; write bench/results/<name>.md and .png."""
    p = argparse.ArgumentParser(
        prog="python -m bench.lowbit",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", default="mlp,lm", help="comma-separated: mlp, lm")
    p.add_argument("--steps", type=int, default=0, help="steps per run (default: REGIMES)")
    p.add_argument("--rounds", type=int, default=1, help="repetitions (default 1)")
    p.add_argument("--hosts", type=int, default=4, help="worker hosts W (default 4)")
    p.add_argument("--target", default=AUTO_TARGET, choices=[AUTO_TARGET, *TARGETS])
    p.add_argument("--name", default="lowbit", help="results file stem (default lowbit)")
    args = p.parse_args(argv)
    args.failed = []  # runs that failed (note_failure), listed under the tables
    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in REGIMES for m in models):
        p.error(f"--models takes a comma-separated list of {', '.join(REGIMES)}")
    args.regime = {
        m: Regime(args.steps, r.lr, r.batch, r.options) if args.steps else r
        for m, r in REGIMES.items()
    }
    if any(r.steps < 10 for r in args.regime.values()):
        p.error("--steps must be at least 10")
    start, target = time.perf_counter(), args.target
    curves: dict[tuple[str, str], list[list[float]]] = {}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="homagg-bench-lowbit-") as tmp:
        for _ in range(args.rounds):
            for model in models:
                target = train(model, args, Path(tmp), curves, times)
    write(models, args, curves, times, seconds=time.perf_counter() - start, target=target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
