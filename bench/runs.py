"""One `python -m run` (Mininet, BMv2 or the reference switch, controller, torchrun) as the
training benchmarks start it, and the statistics they take of its per-step records."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.codecs import DEFAULT_CODEC

REPO = Path(__file__).resolve().parent.parent


@dataclass
class RunSpec:
    """What one `python -m run` trains: model, switch codec, hosts, link rate, the gloo twin
    and the peer methods that run after it in the same network (run/peers.py)."""

    model: str
    codec: str = DEFAULT_CODEC
    hosts: int = 4
    bw_mbit: float = 0.0
    steps: int = 15
    gloo: bool = True
    peers: list[str] = field(default_factory=list)
    target: str = "auto"
    timeout: float = 300.0
    overlap: str = "blocking"  # the switch run's --overlap: blocking, async or dear


def run_once(
    spec: RunSpec, out: Path, output: list[str] | None = None
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Run it; ({run name: rank 0's step records}, the switch target used). Run names:
    "switch, <codec>", "DDP over gloo" and the peer mode names. `output`, if given, gets
    the run's output lines (its summary, auto's and DeAR's choices)."""
    cmd = [sys.executable, "-m", "run", "--model", spec.model, "--steps", str(spec.steps)]
    cmd += ["--hosts", str(spec.hosts), "--target", spec.target, "--codec", spec.codec]
    cmd += ["--out", str(out), "--timeout", str(spec.timeout)]
    if spec.bw_mbit:
        cmd += ["--bw", f"{spec.bw_mbit:g}"]
    if spec.overlap != "blocking":
        cmd += ["--overlap", spec.overlap]
    if not spec.gloo:
        cmd.append("--no-gloo")
    if spec.peers:
        cmd += ["--peers", ",".join(spec.peers)]
    jobs = 2 + int(spec.gloo) + len(spec.peers)
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        stdout, _ = proc.communicate(timeout=jobs * spec.timeout + 120)
    except BaseException:  # timeout or Ctrl-C: let the run tear its network down
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        raise
    if output is not None:
        output.extend(stdout.splitlines())
    target = spec.target
    for line in stdout.splitlines():
        if line.startswith("make run:"):
            target = line.split("switch ")[1].split(",")[0]
    if proc.returncode not in (0, 1):  # 1: parameters differ beyond the bound (still timed)
        print(stdout[-3000:])
        raise RuntimeError(f"{' '.join(cmd[2:])} failed ({proc.returncode})")
    runs = {f"switch, {spec.codec}": read_steps(out / "switch.jsonl")}
    if spec.gloo:
        runs["DDP over gloo"] = read_steps(out / "gloo.jsonl")
    for peer in spec.peers:
        runs[peer] = read_steps(out / f"{peer}.jsonl")
    fell_back = sum(s.get("fallback_buckets", 0) for s in runs[f"switch, {spec.codec}"])
    if fell_back:  # the switch rows would time the process group's all_reduce instead
        print(f"    WARNING: {fell_back} bucket(s) fell back to gloo in the switch run", flush=True)
    return runs, target


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The per-step JSON records rank 0 wrote."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of values."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ms(values: list[float]) -> str:
    """Seconds as "median [p10, p90]" in milliseconds."""
    med = statistics.median(values)
    return f"{med * 1e3:.0f} [{pct(values, 0.1) * 1e3:.0f}, {pct(values, 0.9) * 1e3:.0f}]"


def smoothed(losses: list[float], window: int = 5) -> list[float]:
    """Trailing mean of the last `window` losses per step (one batch's loss is noisy)."""
    return [statistics.mean(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))]


def time_to(steps: list[dict[str, Any]], target: float) -> tuple[float, int] | None:
    """(wall seconds, steps) until the smoothed loss first reaches target, or None."""
    curve = smoothed([s["loss"] for s in steps])
    for i, value in enumerate(curve):
        if value <= target:
            return sum(s["seconds"] for s in steps[: i + 1]), i + 1
    return None
