"""Overlap and adaptation, measured: per setting (model, link rate, batch) the iteration time
of DDP over gloo, the switch hook blocking, the switch hook asynchronous, DeAR mode and
codec="auto" (on the asynchronous hook and in DeAR mode), side by side, with issue 15's
targets judged: auto never slower than gloo and within 10% of the best fixed choice, NCF
>= 6x gloo, and where compute is at least the aggregation time, overlap hides at least half
of it (docs/performance.md defines the hidden fraction).

It reuses `python -m run` (Mininet, controller, torchrun): per setting and round one run
per mode, the blocking one with its gloo twin; odd rounds reverse the order and run gloo
before the switch, so that no mode always goes first. Times: every step but each run's
first (DeAR: its tuned steps), median over all rounds.

    python -m bench.overlap [--quick] [--rounds 2] [--steps 16] [--models ncf,mlp,lm]
        [--bw 0,100] [--also lm:1024:5] [--target auto] [--budget SECONDS] [--name overlap]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.publish import heading, publish
from bench.runs import RunFailed, RunSpec, note_failure, pct, run_once
from homagg.environment import BMV2_OPT_ENV
from homagg.lab.switch_process import AUTO_TARGET, TARGETS

GLOO = "DDP over gloo"
# run name -> (codec, --overlap); "fixed" is the model's fixed codec
MODES = {
    "switch, blocking": ("fixed", "blocking"),
    "switch, async": ("fixed", "async"),
    "DeAR": ("fixed", "dear"),
    "auto": ("auto", "async"),
    "auto, DeAR": ("auto", "dear"),
}
FIXED_CODEC = {
    "ncf": "lossless",
    "ncf-dense": "lossless",
    "mlp": "fixed_point",
    "lm": "fixed_point",
}
# optional runs (--extra): run name -> (codec, --overlap, codec options)
EXTRA = {
    "auto (lag 0)": ("auto", "async", ["lag=0"]),
    "auto (no lease)": ("auto", "async", ["lease=1"]),
}
RUNS = (GLOO, *MODES)
FIXED_RUNS = (GLOO, "switch, blocking", "switch, async", "DeAR")
OVERLAPS = ("switch, async", "DeAR", "auto", "auto, DeAR")
AUTOS = ("auto", "auto, DeAR")
NCF_GOAL, WITHIN, HIDE = 6.0, 0.10, 0.5
QUICK = {"models": "mlp", "bw": "0", "rounds": 1, "steps": 12}


@dataclass(frozen=True)
class Setting:
    """What one row group trains: the model, its links (Mbit/s, 0 unshaped), the batch."""

    model: str
    bw: float = 0.0
    batch: int | None = None

    @property
    def text(self) -> str:
        link = f"{self.bw:g} Mbit/s" if self.bw else "unshaped"
        return f"{self.model}, {link}" + (f", batch {self.batch}" if self.batch else "")

    @staticmethod
    def parse(text: str) -> Setting:
        """MODEL:BATCH:MBITS (e.g. lm:1024:5)."""
        model, batch, bw = [*text.split(":"), "", ""][:3]
        return Setting(model, float(bw or 0), int(batch) if batch else None)


@dataclass
class Tally:
    """Per (setting, run name): each round's step records; the targets and notes seen."""

    runs: dict[tuple[Setting, str], list[list[dict[str, Any]]]] = field(default_factory=dict)
    targets: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def add(self, setting: Setting, name: str, steps: list[dict[str, Any]]) -> None:
        self.runs.setdefault((setting, name), []).append(steps)

    def timed(self, setting: Setting, name: str) -> list[dict[str, Any]]:
        """The timed steps of every round: all but each run's first; DeAR's after tuning."""
        out = []
        for run in self.runs.get((setting, name), []):
            tuned = [s for s in run if s.get("dear_tuned")]
            out += tuned[1:] if run and "dear_bucket_bytes" in run[-1] and tuned else run[1:]
        return out

    def ms(self, setting: Setting, name: str) -> float:
        """Median iteration time in ms (NaN when no step was timed)."""
        steps = self.timed(setting, name)
        return statistics.median(s["seconds"] for s in steps) * 1e3 if steps else math.nan

    def mean_ms(self, setting: Setting, name: str) -> float:
        """Mean iteration time in ms (auto's explorations count here, not in the median)."""
        steps = self.timed(setting, name)
        return statistics.mean(s["seconds"] for s in steps) * 1e3 if steps else math.nan

    def split(self, setting: Setting) -> tuple[float, float]:
        """(compute, aggregation) ms of the blocking run: the aggregation (switch and
        agreement time in the hook) is all exposed there, the rest is compute."""
        steps = self.timed(setting, "switch, blocking")
        if not steps:
            return math.nan, math.nan
        agg = [(s["switch_seconds"] + s["agreement_seconds"]) * 1e3 for s in steps]
        comp = [s["seconds"] * 1e3 - a for s, a in zip(steps, agg)]
        return statistics.median(comp), statistics.median(agg)

    def hidden(self, setting: Setting, name: str) -> float:
        """(blocking - run) / the aggregation time exposed in blocking."""
        _, agg = self.split(setting)
        return (self.ms(setting, "switch, blocking") - self.ms(setting, name)) / agg

    def loss(self, setting: Setting, name: str) -> float:
        """The last step's loss, mean over the rounds."""
        runs = [r for r in self.runs.get((setting, name), []) if r]
        return statistics.mean(r[-1]["loss"] for r in runs) if runs else math.nan


def specs(setting: Setting, rnd: int, args: argparse.Namespace) -> list[tuple[str, RunSpec]]:
    """(run name, spec) of one setting's round in the order they run; odd rounds reverse
    it and run gloo before the switch."""
    modes = {**{k: (*v, []) for k, v in MODES.items()}, **{k: EXTRA[k] for k in args.extra}}
    names = list(modes)[::-1] if rnd % 2 else list(modes)
    out = []
    for name in names:
        codec, overlap, options = modes[name]
        spec = RunSpec(
            setting.model,
            FIXED_CODEC[setting.model] if codec == "fixed" else codec,
            hosts=args.hosts,
            bw_mbit=setting.bw,
            steps=args.steps,
            gloo=name == "switch, blocking",
            target=args.target,
            timeout=args.timeout,
            overlap=overlap,
            peers_first=bool(rnd % 2),
            batch=setting.batch,
            codec_options=options,
        )
        out.append((name, spec))
    return out


def run_setting(setting: Setting, rnd: int, args: argparse.Namespace, tmp: Path, t: Tally) -> None:
    """One round of a setting: every mode once (unless the time budget is spent)."""
    for name, spec in specs(setting, rnd, args):
        if time.monotonic() > args.deadline:
            t.notes.append(f"{setting.text}, round {rnd + 1}: {name} skipped (--budget spent)")
            continue
        t0 = time.perf_counter()
        output: list[str] = []
        try:
            runs, used = run_once(
                spec, tmp / f"{setting.model}-{setting.bw:g}-{rnd}-{name[:6]}", output
            )
        except RunFailed as exc:
            note_failure(args.failed, f"{setting.text}, round {rnd + 1}, {name}", exc)
            continue
        t.targets.add(used)
        t.add(setting, name, runs[spec.switch_run])
        if GLOO in runs:
            t.add(setting, GLOO, runs[GLOO])
        notes = [x for x in output if x.startswith(("auto codec", "auto decisions", "DeAR bucket"))]
        t.notes += [f"{setting.text}, round {rnd + 1}, {name}: {n}" for n in notes]
        if len(runs[spec.switch_run]) < 2:
            print("\n".join(output[-40:]))  # it stopped early: show why
        print(
            f"  {setting.text} round {rnd + 1}: {name}: "
            f"{statistics.median(s['seconds'] for s in runs[spec.switch_run]) * 1e3:.0f} ms "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


def row(setting: Setting, name: str, t: Tally) -> str:
    """One table row."""
    steps = t.timed(setting, name)
    if not steps:
        done = sum(len(r) for r in t.runs.get((setting, name), []))
        return f"| {setting.text} | {name} | stopped after {done} steps | | | | |"
    secs = [s["seconds"] * 1e3 for s in steps]
    spread = f"{t.ms(setting, name):.0f} [{pct(secs, 0.1):.0f}, {pct(secs, 0.9):.0f}]"
    speed = t.ms(setting, GLOO) / t.ms(setting, name)
    hidden = f"{t.hidden(setting, name):.0%}" if name in (*OVERLAPS, *EXTRA) else ""
    return (
        f"| {setting.text} | {name} | {spread} | {t.mean_ms(setting, name):.0f} | "
        f"{speed:.2f}x | {hidden} | {t.loss(setting, name):.4f} |"
    )


def table(settings: list[Setting], t: Tally) -> list[str]:
    """The markdown rows, per setting: gloo and every mode."""
    lines = [
        "| setting | run | ms/iteration median [p10, p90] | mean ms | gloo / run | hidden "
        "| loss (last step) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in settings:
        lines += [row(s, name, t) for name in (*RUNS, *EXTRA) if (s, name) in t.runs]
    return lines


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def judge(setting: Setting, t: Tally) -> list[str]:
    """The setting's targets, judged from the medians."""
    ms = {name: t.ms(setting, name) for name in RUNS}
    if any(math.isnan(v) for v in ms.values()):
        return [f"{setting.text}: not every mode was timed, no verdict"]
    fixed = min(FIXED_RUNS, key=lambda n: ms[n])
    out = [
        f"{setting.text}: {a} {ms[GLOO] / ms[a]:.2f}x gloo (never slower: "
        f"{verdict(ms[a] <= ms[GLOO])}; mean {t.mean_ms(setting, a):.0f} vs "
        f"{t.mean_ms(setting, GLOO):.0f} ms), {ms[a] / ms[fixed]:.2f} x the best fixed "
        f"choice, {fixed} (within {WITHIN:.0%}: {verdict(ms[a] <= (1 + WITHIN) * ms[fixed])})"
        for a in AUTOS
    ]
    if setting.model.startswith("ncf"):  # sparse tables against gloo's sparse all_reduce, or dense
        best = min(RUNS[1:], key=lambda n: ms[n])
        speed = ms[GLOO] / ms[best]
        out.append(
            f"{setting.text}: NCF {speed:.2f}x gloo ({best}; >= {NCF_GOAL:g}x: "
            f"{verdict(speed >= NCF_GOAL)})"
        )
    comp, agg = t.split(setting)
    for name in ("switch, async", "DeAR"):
        h = t.hidden(setting, name)
        applies = comp >= agg
        out.append(
            f"{setting.text}: {name} hides {h:.0%} (compute {comp:.0f} ms, aggregation "
            f"{agg:.0f} ms; >= {HIDE:.0%} where compute >= aggregation: "
            + (verdict(h >= HIDE) if applies else "not applicable")
            + ")"
        )
    return out


def summary_of(settings: list[Setting], t: Tally) -> str:
    """One line for `make bench`: auto against gloo and the best fixed choice, per setting."""
    parts = []
    for s in settings:
        ms = {name: t.ms(s, name) for name in RUNS}
        if any(math.isnan(v) for v in ms.values()):
            continue
        best = min(ms[n] for n in FIXED_RUNS)
        parts.append(
            f"{s.text}: "
            + ", ".join(
                f"{a} {ms[GLOO] / ms[a]:.2f}x gloo, {ms[a] / best:.2f} x best" for a in AUTOS
            )
        )
    targets = ",".join(sorted(t.targets)) or "none"
    return f"overlap ({targets}): " + ("; ".join(parts) or "no setting complete")


def write(settings: list[Setting], args: argparse.Namespace, t: Tally, seconds: float) -> None:
    """bench/results/<name>.md from the rounds so far."""
    targets = ",".join(sorted(t.targets)) or "none yet"
    head = [
        heading("Overlap and auto", f"switch {targets}"),
        "",
        f"`python -m bench.overlap {args.command}`; ran in {seconds:.0f} s, load average "
        f"{os.getloadavg()[0]:.1f} at the end. W = {args.hosts}, switch target: {targets}. "
        f"Fixed codec per model: {FIXED_CODEC}. Every step but each run's first (DeAR: its "
        "tuned steps), median over all rounds; mean: the same steps' mean (auto's "
        "explorations show there). hidden = (blocking - run) / the aggregation time exposed "
        "in blocking (its switch and agreement time per step; docs/performance.md).",
        "",
    ]
    lines = [*head, *table(settings, t), "", "Targets:", ""]
    lines += [f"- {x}" for s in settings for x in judge(s, t)]
    lines += ["", "Notes:", "", *[f"- {n}" for n in t.notes]]
    summary = summary_of(settings, t)
    publish(args.name, [*lines, "", f"Summary: {summary}."], summary, args.failed)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.overlap",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help=f"a short setting: {QUICK}")
    p.add_argument("--rounds", type=int, default=2, help="repetitions (default 2)")
    p.add_argument("--steps", type=int, default=16, help="steps per run (default 16)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--models", default="ncf,mlp,lm")
    p.add_argument("--bw", default="0,100", help="comma-separated Mbit/s; 0: unshaped")
    p.add_argument("--batch", type=int, default=None, help="per rank (default: run's)")
    p.add_argument("--also", action="append", default=[], help="MODEL:BATCH:MBITS, repeatable")
    p.add_argument(
        "--target",
        default=AUTO_TARGET,
        choices=[AUTO_TARGET, *TARGETS],
        help=f"the switch (bmv2-opt: the optimized BMv2 build named by {BMV2_OPT_ENV})",
    )
    p.add_argument("--timeout", type=float, default=0, help="seconds per job (0: from --steps)")
    p.add_argument("--budget", type=float, default=0, help="start no run after SECONDS (0: none)")
    p.add_argument(
        "--extra",
        default="",
        help="comma-separated optional runs beside the matrix (table rows, no verdicts): "
        + "; ".join(f"{k} (codec {v[0]}, {v[1]}, {' '.join(v[2])})" for k, v in EXTRA.items()),
    )
    p.add_argument("--name", default="overlap", help="results file stem (default overlap)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, write bench/results/<name>.md after each setting."""
    p = _parser()
    args = p.parse_args(argv)
    args.failed = []  # runs that failed (note_failure), listed under the tables
    args.command = " ".join(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.models, args.bw, args.rounds, args.steps = (
            QUICK["models"],
            QUICK["bw"],
            QUICK["rounds"],
            QUICK["steps"],
        )
    settings = [
        Setting(m, float(b), args.batch)
        for b in args.bw.split(",")
        if b != ""
        for m in args.models.split(",")
        if m
    ] + [Setting.parse(x) for x in args.also]
    if not settings or any(s.model not in FIXED_CODEC for s in settings):
        p.error(f"models are {', '.join(FIXED_CODEC)}")
    if args.steps < 3:
        p.error("--steps must be at least 3 (each run's first step is not timed)")
    args.extra = [x.strip() for x in args.extra.split(",") if x.strip()]
    if any(x not in EXTRA for x in args.extra):
        p.error(f"--extra: expected some of {', '.join(EXTRA)}")
    start = time.perf_counter()
    args.deadline = time.monotonic() + (args.budget or math.inf)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="homagg-bench-overlap-") as tmp:
        for rnd in range(args.rounds):
            for s in settings:
                run_setting(s, rnd, args, Path(tmp), tally)
                write(settings, args, tally, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
