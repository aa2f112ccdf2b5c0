"""Per-iteration training time, W = 4: DDP over gloo beside DDP with the homagg hook
through the switch, per codec (lossless, 32-bit fixed point, 16- and 8-bit lanes) and
per switch target (e.g. the default and the optimized BMv2 build side by side), on the
sparse model of `make run` (NCF), the small dense MLP and the small transformer LM.

It reuses `python -m run` (Mininet, controller, torchrun; see docs/run.md) and reads the
per-step records rank 0 writes. Each round runs, per model, one `python -m run` per
(target, codec); the first of them also runs DDP over gloo in the same network. Odd rounds
reverse the order of the runs and run gloo before the switch (`--peers-first`), so that
neither side always goes first. Times: every step but each run's first, median
[p10, p90] over the steps of all rounds; where a switch iteration's time goes (compute,
and in the hook: encode, wait, decode, agreement) and its retransmissions come from the
same records.

    python -m bench.training [--steps 15] [--rounds 2] [--models ncf,mlp,lm]
        [--codecs lossless,fixed_point,lowbit16,lowbit8] [--targets bmv2,bmv2-opt]
        [--bmv2-opt PREFIX] [--name training]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import runs as bench_runs
from bench.publish import heading, plot_path, publish, pyplot
from bench.runs import RunSpec, ms, pct, retransmissions, run_once, split_cell, time_split
from homagg.environment import BMV2_OPT_ENV
from homagg.lab.switch_process import AUTO_TARGET, PRESENT_TARGETS, TARGETS, present_targets

GLOO = "DDP over gloo"
DESCRIPTION = {"ncf": "NCF (sparse)", "mlp": "MLP (dense)", "lm": "transformer LM (dense)"}
DETAILS = {
    "ncf": "NCF of `make run` (20,000 x 16 and 4,000 x 16 embeddings and a small MLP: 1.5 MB of "
    "float32 gradients per step, ~1,300 rows touched by the 4 ranks together; DDP over gloo "
    "sends the sparse embedding gradients with gloo's sparse all_reduce)",
    "mlp": "the dense MLP of `python -m run --model mlp` (64-256-256-10: 85k parameters, 340 kB of "
    "float32 gradients per step, all nonzero)",
    "lm": "the transformer language model of `python -m run --model lm` (2 pre-norm layers of "
    "width 64, vocabulary 256, sequence 32: 0.3 MB of float32 gradients per step)",
}
CODEC_TEXT = {"lossless": "lossless", "fixed_point": "fixed point", "lowbit16": "16-bit lanes"}
CODEC_TEXT["lowbit8"] = "8-bit lanes"
# The targets, (model, codec, speed-up over DDP over gloo): issue 17's sparse target, and
# issue 16's for 8-bit lanes on the dense MLP.
GOALS = (("ncf", "lossless", 4.0), ("mlp", "lowbit8", 1.3))


def run_name(codec: str, target: str, targets: list[str]) -> str:
    """A switch row's name; the target is named when several are compared."""
    return f"switch, {codec}" + (f" ({target})" if len(targets) > 1 else "")


def round_specs(model: str, rnd: int, args: argparse.Namespace) -> list[tuple[str, RunSpec]]:
    """(row name, run) of one model's round, in the order they run: the first also runs
    gloo; odd rounds reverse the order and run gloo before the switch."""
    pairs = [(t, c) for t in args.target_list for c in args.codec_list]
    if rnd % 2:
        pairs.reverse()
    return [
        (
            run_name(codec, target, args.target_list),
            RunSpec(
                model,
                codec,
                hosts=args.hosts,
                steps=args.steps,
                gloo=i == 0,
                target=target,
                timeout=args.timeout,
                peers_first=bool(rnd % 2),
            ),
        )
        for i, (target, codec) in enumerate(pairs)
    ]


class Tally:
    """Per (model, row): each run's step records (rounds appended), and the targets used."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
        self.targets: set[str] = set()

    def add(self, model: str, name: str, steps: list[dict[str, Any]]) -> None:
        self.runs.setdefault((model, name), []).append(steps)

    def seconds(self, model: str, name: str) -> list[float]:
        """Iteration seconds of every step but each run's first, all rounds."""
        return [s["seconds"] for run in self.runs[(model, name)] for s in run[1:]]

    def steps(self, model: str, name: str) -> list[dict[str, Any]]:
        """Every run's records but each run's first step (not timed), all rounds."""
        return [s for run in self.runs[(model, name)] for s in run[1:]]

    def speed(self, model: str, name: str) -> float:
        """Median gloo iteration / median iteration of the row."""
        gloo = statistics.median(self.seconds(model, GLOO))
        return gloo / statistics.median(self.seconds(model, name))


def run_round(model: str, rnd: int, args: argparse.Namespace, tmp: Path, tally: Tally) -> None:
    """One model's round: every (target, codec) run, gloo with the first."""
    for name, spec in round_specs(model, rnd, args):
        print(
            f"  training round {rnd + 1}/{args.rounds}: {model} {name}"
            f"{' + gloo' + (' (first)' if spec.peers_first else '') if spec.gloo else ''}",
            flush=True,
        )
        t0 = time.perf_counter()
        out = tmp / f"{model}-{spec.target}-{spec.codec}-{rnd}"
        try:
            runs, used = run_once(spec, out)
        except bench_runs.RunFailed as exc:
            bench_runs.note_failure(args.failed, f"{model}, round {rnd + 1}, {name}", exc)
            continue
        tally.targets.add(used)
        tally.add(model, name, runs[spec.switch_run])
        if GLOO in runs:
            tally.add(model, GLOO, runs[GLOO])
        print(
            f"    done in {time.perf_counter() - t0:.0f} s: "
            + ", ".join(
                f"{n} median {statistics.median(s['seconds'] for s in r[1:]) * 1e3:.0f} ms"
                for n, r in runs.items()
            ),
            flush=True,
        )


def goal_verdict(
    model: str, codec: str, goal: float, args: argparse.Namespace, tally: Tally
) -> str:
    """ "<codec> >= <goal>x: MET" or "...: MISSED (<where the time goes>)" per target."""
    parts = []
    for target in args.target_list:
        name = run_name(codec, target, args.target_list)
        speed = tally.speed(model, name)
        head = f"{CODEC_TEXT.get(codec, codec)} >= {goal:g}x"
        head += f" on {target}" if len(args.target_list) > 1 else ""
        if speed >= goal:
            parts.append(f"target {head}: MET ({speed:.2f}x)")
            continue
        split = time_split(tally.steps(model, name))
        retx, share = retransmissions(tally.steps(model, name), args.hosts)
        gloo = statistics.median(tally.seconds(model, GLOO)) * 1e3
        hook = sum(v for k, v in split.items() if k != "compute") * 1e3
        parts.append(
            f"target {head}: MISSED ({speed:.2f}x: gloo {gloo:.0f} ms; the switch's mean "
            f"iteration is compute {split['compute'] * 1e3:.0f} ms + hook {hook:.0f} ms, of "
            f"which waiting on the switch {split['wait'] * 1e3:.0f} ms, encode "
            f"{split['encode'] * 1e3:.0f} ms, decode {split['decode'] * 1e3:.0f} ms, "
            f"agreement {split['agreement'] * 1e3:.0f} ms; {retx:.1f} retransmissions per "
            f"step, {share:.0%} of the packets)"
        )
    return "; ".join(parts)


def table(models: list[str], args: argparse.Namespace, tally: Tally) -> list[str]:
    """The markdown rows, per model: gloo, then every switch row."""
    lines = [
        "| W | model | run | ms/iteration | gloo / run | compute + hook ms (encode, wait, "
        "decode, agreement) | retransmissions per step (share of packets) | wire vs dense |",
        "|---:|---|---|---:|---:|---|---:|---:|",
    ]
    for model in models:
        for name in [GLOO, *args.row_names]:
            if (model, name) not in tally.runs:
                continue
            steps = tally.steps(model, name)
            retx, share = retransmissions(steps, args.hosts)
            wire = statistics.mean(s["tx_bytes"] / s["dense_bytes"] for s in steps)
            secs = tally.seconds(model, name)
            lines.append(
                f"| {args.hosts} | {DESCRIPTION[model]} | {name} | {ms(secs)} "
                f"| {tally.speed(model, name):.2f}x | {split_cell(time_split(steps))} "
                f"| {'-' if name == GLOO else f'{retx:.1f} ({share:.0%})'} | {wire:.2f}x |"
            )
    return lines


def summary_of(models: list[str], args: argparse.Namespace, tally: Tally) -> str:
    """One line: per model the speed of every switch row, and the targets judged."""
    parts = []
    for model in models:
        rows = [n for n in args.row_names if (model, n) in tally.runs]
        part = f"{model}: " + ", ".join(
            f"{n.removeprefix('switch, ')} {tally.speed(model, n):.2f}x" for n in rows
        )
        for goal_model, codec, goal in GOALS:
            if goal_model == model and codec in args.codec_list:
                part += f" ({goal_verdict(model, codec, goal, args, tally)})"
        parts.append(part)
    targets = ",".join(sorted(tally.targets))
    return f"training W={args.hosts} ({targets}), speed vs DDP over gloo: " + "; ".join(parts)


def plot(models: list[str], names: list[str], tally: Tally, title: str, path: Path) -> None:
    """Median iteration time per model and run, with p10-p90 whiskers, log scale."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(names) * len(models)), 3.8))
    width = 0.8 / len(names)
    colors = ("0.4", "tab:green", "tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:cyan")
    for j, name in enumerate(names):
        have = [m for m in models if (m, name) in tally.runs]
        xs = [models.index(m) + (j - (len(names) - 1) / 2) * width for m in have]
        s = [tally.seconds(m, name) for m in have]
        med = [statistics.median(x) * 1e3 for x in s]
        err = [
            [m - pct(x, 0.1) * 1e3 for m, x in zip(med, s)],
            [pct(x, 0.9) * 1e3 - m for m, x in zip(med, s)],
        ]
        ax.bar(xs, med, width, yerr=err, capsize=3, color=colors[j % len(colors)], label=name)
    ax.set_xticks(range(len(models)), [DESCRIPTION[m] for m in models])
    ax.set_yscale("log")
    ax.set_ylabel("ms per iteration (median, p10-p90)")
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(models: list[str], args: argparse.Namespace, tally: Tally, seconds: float) -> None:
    """bench/results/<name>.md and .png from the rounds so far."""
    targets = ",".join(sorted(tally.targets))
    lines = [
        heading("Training iteration time"),
        "",
        f"`python -m bench.training --steps {args.steps} --rounds {args.rounds} --models "
        f"{','.join(models)} --codecs {args.codecs} --targets {args.targets}`; ran in "
        f"{seconds:.0f} s. `python -m run` (Mininet, {args.hosts} hosts, switch {targets}, "
        "unshaped links). Iteration time of every step but each run's first: median "
        "[p10, p90] over all rounds. Compute + hook: mean ms per iteration outside the "
        "hook's switch work (forward, backward, optimizer) and in it: the codec's encoding "
        "and decoding, the wait on the switch (sending, results, retransmissions) and the "
        "ranks' agreement all_reduces. Retransmissions: all ranks, per step. Wire: bytes "
        "each host sent per step (mean over the ranks; everything: aggregation, gloo, "
        "control) / dense gradient bytes.",
        "",
        *(f"- {DESCRIPTION[m]}: {DETAILS[m]}." for m in models),
        "",
        *table(models, args, tally),
    ]
    summary = summary_of(models, args, tally)
    lines += ["", f"Summary: {summary}.", "", f"![training iteration time]({args.name}.png)", ""]
    title = f"training, W={args.hosts}, {targets}"
    plot(models, [GLOO, *args.row_names], tally, title, plot_path(f"{args.name}.png"))
    publish(args.name, lines, summary, args.failed)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.training",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=15, help="steps per run (default 15)")
    p.add_argument("--rounds", type=int, default=2, help="repetitions (default 2)")
    p.add_argument("--hosts", type=int, default=4, help="worker hosts W (default 4)")
    p.add_argument("--models", default="ncf,mlp,lm", help="comma-separated: ncf, mlp, lm")
    p.add_argument(
        "--codecs",
        default="lossless,fixed_point,lowbit16,lowbit8",
        help="comma-separated switch codecs (python -m run --codec)",
    )
    p.add_argument(
        "--targets",
        default=AUTO_TARGET,
        help="comma-separated switch targets, alternated: auto, present (auto's target and "
        f"ebpf beside it where the kernel allows it) or {', '.join(TARGETS)}",
    )
    p.add_argument(
        "--bmv2-opt",
        type=Path,
        default=None,
        metavar="PREFIX",
        help=f"the optimized BMv2 build's prefix for target bmv2-opt (default ${BMV2_OPT_ENV})",
    )
    p.add_argument("--timeout", type=float, default=0, help="seconds per job (0: from --steps)")
    p.add_argument("--name", default="training", help="results file stem (default training)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, write bench/results/<name>.md and .png."""
    p = _parser()
    args = p.parse_args(argv)
    args.failed = []  # runs that failed (note_failure), listed under the tables
    models = [m for m in args.models.split(",") if m]
    args.codec_list = [c for c in args.codecs.split(",") if c]
    args.target_list = [t for t in args.targets.split(",") if t]
    if PRESENT_TARGETS in args.target_list:
        args.target_list = present_targets()
    if not models or any(m not in DESCRIPTION for m in models):
        p.error(f"--models takes a comma-separated list of {', '.join(DESCRIPTION)}")
    if not args.codec_list:
        p.error("--codecs needs at least one codec")
    if not args.target_list or any(t not in (AUTO_TARGET, *TARGETS) for t in args.target_list):
        p.error(f"--targets takes auto, present or a comma-separated list of {', '.join(TARGETS)}")
    if args.steps < 2:
        p.error("--steps must be at least 2 (each run's first step is not timed)")
    if args.bmv2_opt is not None:
        os.environ[BMV2_OPT_ENV] = str(args.bmv2_opt)  # the runs' switch processes read it
    args.row_names = [
        run_name(c, t, args.target_list) for t in args.target_list for c in args.codec_list
    ]
    start, tally = time.perf_counter(), Tally()
    with tempfile.TemporaryDirectory(prefix="homagg-bench-train-") as tmp:
        for rnd in range(args.rounds):
            for model in models:
                run_round(model, rnd, args, Path(tmp), tally)
            write(models, args, tally, time.perf_counter() - start)  # runs are long
    return 0


if __name__ == "__main__":
    sys.exit(main())
