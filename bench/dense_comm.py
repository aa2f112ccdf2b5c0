"""The dense models' communication: dense fixed point at 32 bits through the switch against
DDP over gloo in the same network (`python -m run`, W hosts), per step and per
communication. The switch's communication is its DDP hook's time per step (encode, wait on
the switch, decode, and the ranks' agreement all_reduces); gloo's is the time its
all_reduces are in flight (DDP's own all_reduce timed by a comm hook: run/comm_timer.py).
Compute is most of a dense step on a small machine, so the step ratio understates what
the communication gains; both are reported.

Settings: MODEL or MODEL:BATCH (positives per rank and step; the LM takes BATCH // 4
sequences), each unshaped and at every --bw rate (htb on every link). Per round and
setting one `python -m run` with the fixed-point job and DDP over gloo in the same network;
odd rounds run gloo first (--peers-first). Steps: every step but each run's first.

    python -m bench.dense_comm [--settings mlp,lm,lm:8] [--bw 0 100] [--steps 20]
        [--rounds 2] [--target ebpf] [--name dense_comm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.publish import heading, publish
from bench.runs import RunFailed, RunSpec, note_failure, run_once, time_split
from homagg.lab.switch_process import TARGETS

GLOO = "DDP over gloo"
SWITCH = "switch, fixed_point"
STEP_TARGET = 1.3  # the communication-bound setting: the switch >= 1.3x gloo per step


@dataclass(frozen=True)
class Setting:
    """A model and its batch per rank (None: run's default)."""

    model: str
    batch: int | None = None

    @property
    def label(self) -> str:
        return self.model + (f", batch {self.batch}" if self.batch else "")


def parse_settings(text: str) -> list[Setting]:
    """ "mlp,lm,lm:8" -> the settings; a ValueError that says the form for anything else."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        model, _, batch = item.partition(":")
        if model not in ("mlp", "lm"):
            raise ValueError(f"setting {item!r}: the model must be mlp or lm (MODEL[:BATCH])")
        if batch and (not batch.isdigit() or int(batch) < 4):
            raise ValueError(f"setting {item!r}: BATCH must be an integer >= 4")
        out.append(Setting(model, int(batch) if batch else None))
    return out


def comm_seconds(step: dict[str, Any], method: str) -> float:
    """One step's communication: gloo's all_reduces in flight, or the switch hook's time
    (its switch work and the agreement all_reduces)."""
    if method == GLOO:
        return float(step.get("allreduce_seconds", 0.0))
    return float(step.get("switch_seconds", 0.0)) + float(step.get("agreement_seconds", 0.0))


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Medians over the steps of both methods and the ratios gloo / switch."""
    med = {}
    for m in (GLOO, SWITCH):
        steps = runs[m]
        med[f"{m} step"] = statistics.median(s["seconds"] for s in steps)
        med[f"{m} comm"] = statistics.median(comm_seconds(s, m) for s in steps)
    return {
        **med,
        "step ratio": med[f"{GLOO} step"] / med[f"{SWITCH} step"],
        "comm ratio": med[f"{GLOO} comm"] / med[f"{SWITCH} comm"]
        if med[f"{SWITCH} comm"]
        else float("nan"),
    }


def measure(args: argparse.Namespace, tmp: Path) -> None:
    """Every round, setting and rate: one run; the results written after each (runs are
    long)."""
    start = time.perf_counter()
    got: dict[tuple[Setting, float], dict[str, list[dict[str, Any]]]] = {}
    loads: dict[tuple[Setting, float], list[float]] = {}
    failed: list[str] = []
    for rnd in range(args.rounds):
        for setting in args.settings:
            for bw in args.bw:
                spec = RunSpec(
                    setting.model, "fixed_point", args.hosts, bw, args.steps, True, [],
                    args.target, batch=setting.batch, pool_size=args.pool,
                )  # fmt: skip
                spec.peers_first = bool(rnd % 2)
                where = f"{setting.label}, {bw:g} Mbit/s" if bw else f"{setting.label}, unshaped"
                print(f"  round {rnd + 1}: {where}", flush=True)
                try:
                    runs, _ = run_once(spec, tmp / f"{setting.model}-{setting.batch}-{bw}-{rnd}")
                except RunFailed as exc:
                    note_failure(failed, f"{where}, round {rnd + 1}", exc)
                else:
                    loads.setdefault((setting, bw), []).append(os.getloadavg()[0])
                    for m in (GLOO, SWITCH):
                        got.setdefault((setting, bw), {}).setdefault(m, []).extend(runs[m][1:])
                data = {"runs": got, "loads": loads}  # failed runs listed too
                lines, summary = report(data, args, time.perf_counter() - start)
                publish(args.name, lines, summary, failed)


def report(data: dict, args: argparse.Namespace, elapsed: float) -> tuple[list[str], str]:
    """The markdown table and the one-line summary."""
    lines = [
        heading("Dense models: the switch's communication against gloo's"),
        "",
        f"`python -m bench.dense_comm --settings {args.settings_text} --bw "
        f"{' '.join(f'{b:g}' for b in args.bw)} --steps {args.steps} --rounds {args.rounds} "
        f"--hosts {args.hosts} --target {args.target}"
        f"{f' --pool {args.pool}' if args.pool else ''}`; {elapsed:.0f} s so far.",
        "",
        "Per step, median over every step but each run's first, all rounds: the step "
        "(forward, backward, optimizer and the communication), and the communication: for "
        "DDP over gloo its all_reduces in flight (DDP's own all_reduce timed by a comm "
        "hook), for the switch (dense fixed point, 32 bits) its DDP hook (encode, wait, "
        "decode, agreement). Ratios: gloo / switch (above 1: the switch is faster). Split: "
        "the switch step's mean ms (compute + hook: encode, wait, decode, agreement). Load: "
        "the 1-minute load average after each run (median).",
        "",
        "| setting | links | gloo step ms | switch step ms | step ratio | gloo comm ms "
        "| switch comm ms | comm ratio | switch split ms | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    verdicts = []
    for (setting, bw), runs in data["runs"].items():
        if set(runs) != {GLOO, SWITCH}:
            continue
        s = summarize(runs)
        split = time_split(runs[SWITCH])
        hook = {k: round(v * 1e3) for k, v in split.items()}
        links = f"{bw:g} Mbit/s" if bw else "unshaped"
        lines.append(
            f"| {setting.label} | {links} | {s[f'{GLOO} step'] * 1e3:.0f} | "
            f"{s[f'{SWITCH} step'] * 1e3:.0f} | {s['step ratio']:.2f}x | "
            f"{s[f'{GLOO} comm'] * 1e3:.0f} | {s[f'{SWITCH} comm'] * 1e3:.0f} | "
            f"{s['comm ratio']:.2f}x | {hook['compute']} + (enc {hook['encode']}, wait "
            f"{hook['wait']}, dec {hook['decode']}, agree {hook['agreement']}) | "
            f"{statistics.median(data['loads'][(setting, bw)]):.1f} |"
        )
        verdicts.append(f"{setting.label} {links} step {s['step ratio']:.2f}x")
    summary = "dense comm (switch vs gloo per step, W=" + f"{args.hosts}): " + ", ".join(verdicts)
    return [*lines, "", f"Target for the communication-bound setting: >= {STEP_TARGET}x.", ""], (
        summary
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--settings", default="mlp,lm,lm:8",
        help="MODEL[:BATCH],... (models mlp, lm; default mlp,lm,lm:8)",
    )  # fmt: skip
    p.add_argument(
        "--bw", type=float, nargs="+", default=[0.0, 100.0],
        help="link rates in Mbit/s, 0 unshaped (default 0 100)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    p.add_argument("--rounds", type=int, default=2, help="repetitions (default 2)")
    p.add_argument("--hosts", type=int, default=4, help="worker hosts W (default 4)")
    p.add_argument("--target", default="ebpf", choices=TARGETS, help="switch (default ebpf)")
    p.add_argument(
        "--pool", type=int, default=None,
        help="the switch job's pool, packets in flight per rank (default: make run's, 8)",
    )  # fmt: skip
    p.add_argument("--name", default="dense_comm", help="results file stem")
    args = p.parse_args(argv)
    try:
        args.settings_text, args.settings = args.settings, parse_settings(args.settings)
    except ValueError as exc:
        p.error(str(exc))
    if any(b < 0 for b in args.bw) or args.steps < 2 or args.rounds < 1:
        p.error("--bw must be >= 0, --steps >= 2 and --rounds >= 1")
    if args.pool is not None and args.pool < 1:
        p.error("--pool must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="homagg-bench-dense-") as tmp:
        measure(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
