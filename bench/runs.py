"""One `python -m run` (Mininet, BMv2 or the reference switch, controller, torchrun) as the
training benchmarks start it, and the statistics they take of its per-step records."""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from homagg.lab import REPO_ROOT
from homagg.lab.switch_process import AUTO_TARGET
from homagg.wire.constants import AGG_FRAME_BYTES
from homagg.worker.codecs import DEFAULT_CODEC


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
    target: str = AUTO_TARGET
    timeout: float = 0.0  # seconds per training job; 0: job_timeout(steps)
    overlap: str = "blocking"  # the switch run's --overlap: blocking, async or dear
    codec_options: list[str] = field(default_factory=list)  # KEY=VALUE (--codec-option)
    peers_first: bool = False  # gloo and the peers before the switch run (--peers-first)
    lr: float | None = None  # SGD learning rate (None: the model's default)
    batch: int | None = None  # per rank and step (None: run's default)
    pool_size: int | None = None  # the switch job's pool (--pool-size; None: run's default)

    @property
    def switch_run(self) -> str:
        """The switch run's name in run_once's answer: "switch, <codec>[ KEY=VALUE...]"."""
        return " ".join([f"switch, {self.codec}", *self.codec_options])

    def job_timeout(self) -> float:
        """Seconds one training job may take: the given timeout, or job_timeout(steps)."""
        return self.timeout or job_timeout(self.steps)


# A job's start (torchrun, torch imports, rendezvous, the switch job's join) took ~25 s on
# 2 cores; the slowest steps measured were ~8 s (NCF, fixed point, BMv2 under load).
JOB_START_S = 120.0
STEP_BUDGET_S = 15.0


def job_timeout(steps: int) -> float:
    """The time budget of one training job of `steps` steps (`python -m run --timeout`):
    scales with the steps, so BENCH=full's longer runs get room too."""
    return JOB_START_S + STEP_BUDGET_S * steps


def run_command(spec: RunSpec, out: Path) -> list[str]:
    """The `python -m run` command line of `spec`, writing its records to `out`."""
    cmd = [sys.executable, "-m", "run", "--model", spec.model, "--steps", str(spec.steps)]
    cmd += ["--hosts", str(spec.hosts), "--target", spec.target, "--codec", spec.codec]
    cmd += ["--out", str(out), "--timeout", f"{spec.job_timeout():g}"]
    cmd += [arg for kv in spec.codec_options for arg in ("--codec-option", kv)]
    if spec.lr is not None:
        cmd += ["--lr", f"{spec.lr:g}"]
    if spec.batch is not None:
        cmd += ["--batch", str(spec.batch)]
    if spec.pool_size is not None:
        cmd += ["--pool-size", str(spec.pool_size)]
    if spec.peers_first:
        cmd.append("--peers-first")
    if spec.bw_mbit:
        cmd += ["--bw", f"{spec.bw_mbit:g}"]
    if spec.overlap != "blocking":
        cmd += ["--overlap", spec.overlap]
    if not spec.gloo:
        cmd.append("--no-gloo")
    if spec.peers:
        cmd += ["--peers", ",".join(spec.peers)]
    return cmd


INTERRUPTED = 130  # `python -m run`'s exit status after Ctrl-C (docs/run.md)


class RunFailed(RuntimeError):
    """A `python -m run` that did not produce its step records (a job failed or timed
    out): the benchmarks note it and go on with the next run."""


def note_failure(failed: list[str], what: str, exc: RunFailed) -> None:
    """Print and keep a failed run (publish lists them under the tables)."""
    failed.append(f"{what}: {exc}")
    print(f"    FAILED: {what}: {exc}", flush=True)


def run_once(
    spec: RunSpec, out: Path, output: list[str] | None = None
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Run it; ({run name: rank 0's step records}, the switch target used). Run names:
    spec.switch_run ("switch, <codec>"), "DDP over gloo" and the peer mode names. `output`,
    if given, gets the run's output lines (its summary, auto's and DeAR's choices)."""
    cmd = run_command(spec, out)
    jobs = 2 + int(spec.gloo) + len(spec.peers)
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        stdout, _ = proc.communicate(timeout=jobs * spec.job_timeout() + 120)
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
        found = re.match(r"make run: .*?switch target ([\w-]+)", line)
        if found:
            target = found.group(1)
    if proc.returncode == INTERRUPTED:  # Ctrl-C reached the run: the user wants to stop
        raise KeyboardInterrupt(f"{' '.join(cmd[2:])} was interrupted")
    files = {spec.switch_run: "switch", **({"DDP over gloo": "gloo"} if spec.gloo else {})}
    files.update({peer: peer for peer in spec.peers})
    missing = [f"{f}.jsonl" for f in files.values() if not (out / f"{f}.jsonl").is_file()]
    if proc.returncode not in (0, 1) or missing:  # 1: parameters differ (still timed)
        why = [x for x in stdout.splitlines() if x.startswith("make run failed")]
        print(stdout[-3000:])
        raise RunFailed(
            f"{' '.join(cmd[2:])}: exit {proc.returncode}"
            + (f", no {', '.join(missing)}" if missing else "")
            + (f" ({why[-1]})" if why else "")
        )
    runs = {name: read_steps(out / f"{f}.jsonl") for name, f in files.items()}
    fell_back = sum(s.get("fallback_buckets", 0) for s in runs[spec.switch_run])
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


PARTS = ("compute", "encode", "wait", "decode", "agreement")
"""Where a switch iteration's time goes (run/train.py's records): compute (forward,
backward and the optimizer: the iteration outside the hook's switch work), and inside the
DDP hook the codec's encoding (up to its last phase), the exchanges with the switch
(sending, waiting for results, retransmitting), the codec's decoding, and the ranks' tiny
agreement all_reduces."""


def time_split(timed: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per iteration of each of PARTS over the given (timed) steps (means, so
    the parts add up to the mean iteration time); zeros in the hook for a run without it."""
    n = len(timed)
    hook = {
        "encode": sum(s.get("encode_seconds", 0.0) for s in timed) / n,
        "wait": sum(s.get("wait_seconds", 0.0) for s in timed) / n,
        "decode": sum(s.get("decode_seconds", 0.0) for s in timed) / n,
        "agreement": sum(s.get("agreement_seconds", 0.0) for s in timed) / n,
    }
    switch = sum(s.get("switch_seconds", 0.0) for s in timed) / n
    # what the transport did not time of the hook's switch work (codec set-up) is encoding
    hook["encode"] += max(0.0, switch - hook["encode"] - hook["wait"] - hook["decode"])
    mean = sum(s["seconds"] for s in timed) / n
    return {"compute": max(0.0, mean - switch - hook["agreement"]), **hook}


def split_cell(split: dict[str, float]) -> str:
    """ "compute 60 + hook 350 (encode 20, wait 310, decode 15, agree 5)" in ms."""
    hook = sum(v for k, v in split.items() if k != "compute")
    if hook == 0:
        return "-"
    ms_ = {k: round(v * 1e3) for k, v in split.items()}
    return (
        f"{ms_['compute']} + {round(hook * 1e3)} (enc {ms_['encode']}, wait {ms_['wait']}, "
        f"dec {ms_['decode']}, agree {ms_['agreement']})"
    )


def retransmissions(timed: list[dict[str, Any]], world_size: int) -> tuple[float, float]:
    """(retransmissions per step, all ranks; their share of the aggregation packets sent)
    over the given steps."""
    retx = sum(s.get("retransmissions", 0) for s in timed) / len(timed)
    frames = sum(s.get("agg_wire", 0.0) for s in timed) / len(timed) * world_size / AGG_FRAME_BYTES
    return retx, (retx / frames if frames else 0.0)
