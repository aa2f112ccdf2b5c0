"""Per-iteration training time of the sparse model of `make run` (NCF), W = 4: DDP over
gloo vs DDP with the homagg hook through the switch (lossless and dense fixed point).

It reuses `python -m run` (Mininet, controller, torchrun; see docs/run.md) with fewer
steps and reads the per-step records rank 0 writes to {switch,gloo}.jsonl. Each round
runs the lossless job (then, in the same Mininet, its gloo twin) and the fixed-point job;
rounds alternate the codecs. Times are iteration times of every step but the first of
each run: median [p10, p90] over the steps of all rounds.

    python -m bench.training [--steps 15] [--rounds 2] [--target auto]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def _steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--target", default="auto", choices=["auto", "bmv2", "refswitch"])
    p.add_argument("--timeout", type=float, default=300, help="seconds per `python -m run`")
    args = p.parse_args(argv)
    start = time.perf_counter()
    samples: dict[str, list[float]] = {}
    wire: dict[str, list[float]] = {}
    target_used = args.target
    with tempfile.TemporaryDirectory(prefix="homagg-bench-train-") as tmp:
        for rnd in range(args.rounds):
            order = [("lossless", False), ("fixed_point", True)]
            if rnd % 2:
                order.reverse()
            for codec, no_gloo in order:
                out = Path(tmp) / f"{codec}-{rnd}"
                cmd = [sys.executable, "-m", "run", "--steps", str(args.steps), "--hosts", str(args.hosts),
                       "--target", args.target, "--codec", codec, "--out", str(out),
                       "--timeout", str(args.timeout)] + (["--no-gloo"] if no_gloo else [])
                print(f"  training round {rnd + 1}/{args.rounds}: python -m run --codec {codec}"
                      f"{' --no-gloo' if no_gloo else ''} --steps {args.steps}", flush=True)
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=2 * args.timeout + 120)
                for line in proc.stdout.splitlines():
                    if line.startswith("make run:"):
                        target_used = line.split("switch ")[1].split(",")[0]
                if proc.returncode not in (0, 1):  # 1: parameters differ beyond the bound (still timed)
                    print(proc.stdout[-3000:])
                    raise RuntimeError(f"python -m run --codec {codec} failed ({proc.returncode})")
                runs = {f"switch, {codec}": out / "switch.jsonl"}
                if not no_gloo:
                    runs["DDP over gloo"] = out / "gloo.jsonl"
                for name, path in runs.items():
                    steps = _steps(path)
                    samples.setdefault(name, []).extend(s["seconds"] for s in steps[1:])
                    wire.setdefault(name, []).extend(s["tx_bytes"] / s["dense_bytes"] for s in steps)
                print(f"    done in {time.perf_counter() - t0:.0f} s: " + ", ".join(
                    f"{n} median {statistics.median(samples[n][-(args.steps - 1):]) * 1e3:.0f} ms"
                    for n in runs), flush=True)
    gloo = statistics.median(samples["DDP over gloo"])
    lines = [f"# Training iteration time ({platform.machine()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d')})", "",
             f"`python -m bench.training --steps {args.steps} --rounds {args.rounds}`; ran in "
             f"{time.perf_counter() - start:.0f} s. `python -m run` (Mininet, {args.hosts} hosts, switch "
             f"{target_used}, unshaped links), NCF of `make run` (20,000 x 16 and 4,000 x 16 embeddings, "
             "1.5 MB of float32 gradients per step, a few hundred rows touched). Iteration time of "
             "every step but each run's first: median [p10, p90] over "
             f"{args.rounds} x {args.steps - 1} steps; wire = bytes rank 0's host sent per step / dense "
             "gradient bytes.", "",
             "| W | model | run | ms/iteration | gloo / run | wire vs dense |",
             "|---:|---|---|---:|---:|---:|"]
    for name in ("DDP over gloo", "switch, lossless", "switch, fixed_point"):
        s = samples[name]
        med = statistics.median(s)
        lines.append(f"| {args.hosts} | NCF (sparse) | {name} | {med * 1e3:.0f} [{_pct(s, 0.1) * 1e3:.0f}, "
                     f"{_pct(s, 0.9) * 1e3:.0f}] | {gloo / med:.2f}x | {statistics.mean(wire[name]):.2f}x |")
    summary = (f"training W={args.hosts} ({target_used}): lossless {gloo / statistics.median(samples['switch, lossless']):.2f}x, "
               f"fixed point {gloo / statistics.median(samples['switch, fixed_point']):.2f}x the speed of DDP over gloo")
    lines += ["", f"Summary: {summary}.", "",
              "The small dense model of issue 6 is not measured (see docs/performance.md).", ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "training.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("SUMMARY " + summary, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
