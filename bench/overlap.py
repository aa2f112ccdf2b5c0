"""Overlap and adaptation, measured: per model (NCF, the dense MLP, the small transformer
LM) and link (unshaped, shaped), the iteration time of DDP over gloo, the switch hook
blocking, the switch hook asynchronous, DeAR mode and codec="auto", and the hidden
fraction of each overlap mode: (blocking - mode) / the blocking run's communication time
(switch + agreement seconds per step).

It reuses `python -m run` (Mininet, controller, torchrun) with few steps: the blocking
run with its gloo twin, then async, dear and auto (--no-gloo), in that order, per model.

    python -m bench.overlap [--steps 16] [--hosts 4] [--bw 0,100] [--models ncf,mlp,lm]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.publish import publish
from bench.runs import RunSpec, run_once
from testnet.switch_process import AUTO_TARGET

# run name -> (codec, overlap); the codec of the fixed runs is each model's best fixed one
MODES = {
    "switch, blocking": ("fixed", "blocking"),
    "switch, async": ("fixed", "async"),
    "DeAR": ("fixed", "dear"),
    "auto": ("auto", "async"),
}
FIXED_CODEC = {"ncf": "lossless", "mlp": "fixed_point", "lm": "fixed_point"}
RUNS = ("DDP over gloo", *MODES)


def one_run(model: str, name: str, bw: float, args: argparse.Namespace, out: Path) -> dict:
    """`python -m run` for one switch run (the blocking one with its gloo twin)."""
    codec, overlap = MODES[name]
    codec = FIXED_CODEC[model] if codec == "fixed" else codec
    spec = RunSpec(
        model,
        codec,
        hosts=args.hosts,
        bw_mbit=bw,
        steps=args.steps,
        gloo=name == "switch, blocking",
        target=args.target,
        timeout=args.timeout,
        overlap=overlap,
    )
    output: list[str] = []
    got, _ = run_once(spec, out, output)
    runs: dict = {name: got[f"switch, {codec}"]}
    if "DDP over gloo" in got:
        runs["DDP over gloo"] = got["DDP over gloo"]
    if len(runs[name]) < 2:  # it stopped early: show why
        print("\n".join(output[-40:]))
    notes = [x for x in output if x.startswith(("auto codec choices", "DeAR bucket size"))]
    if notes:
        runs["notes"] = notes
    return runs


def median_ms(steps: list[dict]) -> float:
    """Median iteration time in ms, each run's first step (and DeAR's tuning) left out;
    NaN when the run timed too few steps (it stopped early: the row says so)."""
    tuned = [s for s in steps if s.get("dear_tuned")][1:]
    tail = tuned if steps and "dear_bucket_bytes" in steps[-1] and tuned else steps[1:]
    if not tail:
        return math.nan
    return statistics.median(s["seconds"] for s in tail) * 1e3


def table(results: dict, models: list[str], bws: list[float], hosts: int) -> list[str]:
    """Markdown rows: iteration time per run, speed vs gloo, hidden fraction."""
    lines = [
        "| links | model | run | ms/iteration | gloo / run | hidden |",
        "|---|---|---|---:|---:|---:|",
    ]
    for bw in bws:
        for m in models:
            r = results[(bw, m)]
            gloo = median_ms(r["DDP over gloo"])
            block = median_ms(r["switch, blocking"])
            comm = statistics.median(
                (s["switch_seconds"] + s["agreement_seconds"]) * 1e3
                for s in r["switch, blocking"][1:]
            )
            for name in RUNS:
                ms = median_ms(r[name])
                link = f"{bw:g} Mbit/s" if bw else "unshaped"
                if math.isnan(ms):
                    steps = len(r[name])
                    lines.append(f"| {link} | {m} | {name} | stopped after {steps} steps | | |")
                    continue
                hidden = (
                    f"{(block - ms) / comm:.0%}"
                    if name in ("switch, async", "DeAR", "auto") and comm > 0
                    else ""
                )
                lines.append(f"| {link} | {m} | {name} | {ms:.0f} | {gloo / ms:.2f}x | {hidden} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--name", default="overlap", help="results file name (bench/results/)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--models", default="ncf,mlp,lm")
    p.add_argument("--bw", default="0,100", help="comma-separated Mbit/s; 0: unshaped")
    p.add_argument("--target", default=AUTO_TARGET, choices=[AUTO_TARGET, "bmv2", "refswitch"])
    p.add_argument("--timeout", type=float, default=240, help="seconds per `python -m run`")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    bws = [float(b) for b in args.bw.split(",") if b]
    start = time.perf_counter()
    results: dict = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="homagg-bench-overlap-") as tmp:
        for bw in bws:
            for m in models:
                r: dict = {}
                for name in MODES:
                    t0 = time.perf_counter()
                    got = one_run(m, name, bw, args, Path(tmp) / f"{m}-{bw:g}-{name[:6]}")
                    notes += [f"{m}, {bw:g} Mbit/s, {name}: {n}" for n in got.pop("notes", [])]
                    r.update(got)
                    print(
                        f"  {m} {bw:g} {name}: {median_ms(got[name]):.0f} ms/iteration "
                        f"({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
                results[(bw, m)] = r
                done = [b for b in bws if all((b, x) in results for x in models)] or [bw]
                done_models = [x for x in models if (bw, x) in results]
                # partial results on disk after each model (a bounded run keeps what it did)
                publish(args.name, table(results, done_models, done, args.hosts))
    head = [
        f"# Overlap and auto ({platform.machine()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m bench.overlap --steps {args.steps} --hosts {args.hosts} --bw {args.bw} "
        f"--models {args.models}`; ran in {time.perf_counter() - start:.0f} s. Fixed codec "
        f"per model: {FIXED_CODEC}. hidden = (blocking - run) / blocking's communication time.",
        "",
    ]
    lines = [*head, *table(results, models, bws, args.hosts), "", *[f"- {n}" for n in notes]]
    publish(args.name, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
