"""Two ranks (subprocesses) train with DDP through the reference switch in namespaces, with
the switch hook (lossless and fixed point), and end at the parameters of plain DDP over gloo;
with the switch killed mid-training they fall back to gloo, warn once and finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from homagg.lab.controlled import Controlled
from homagg.lab.namespace import have_privileges
from homagg.lab.poll import wait_for

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
WORLD = 2
WORKER = Path(__file__).with_name("ddp_train_worker.py")
ROOT = Path(__file__).resolve().parents[2]
# Fixed point with 30 magnitude bits per worker (W = 2) quantizes below float32's own
# rounding; 10 SGD steps keep the two runs within a few ulps of the parameters' scale.
ATOL, RTOL = 1e-5, 1e-4
# s: a run's bound, and the join timeout of the jobs made before its ranks start, so that a
# start-up slowed by load (two torch imports in namespaces) never ends a job before it fails
RUN_S = 180.0


def launch(
    c: Controlled, tmp: Path, jobs: list[str], kill_dir: Path | None = None
) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{WORKER.parent}", "GLOO_SOCKET_IFNAME": "lo"}
    procs = []
    for r in range(WORLD):
        cmd = [
            sys.executable,
            str(WORKER),
            "--rank",
            str(r),
            "--world",
            str(WORLD),
            "--store",
            str(tmp / "store"),
            "--controller",
            c.address,
            "--netns",
            c.fabric.hosts[r].namespace,
            "--out",
            str(tmp / f"r{r}.pt"),
        ]
        for spec in jobs:
            cmd += ["--job", spec]
        if kill_dir is not None:
            cmd += ["--kill-dir", str(kill_dir)]
        with open(tmp / f"r{r}.log", "w") as rank_log:  # the rank keeps its own descriptor
            procs.append(subprocess.Popen(cmd, env=env, stdout=rank_log, stderr=subprocess.STDOUT))
    return procs


def finish(procs: list[subprocess.Popen], tmp: Path, timeout: float) -> list[tuple[dict, dict]]:
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(5)
    logs = "\n".join((tmp / f"r{r}.log").read_text()[-3000:] for r in range(WORLD))
    assert all(p.returncode == 0 for p in procs), f"a rank failed or hung:\n{logs}"
    return [
        (torch.load(tmp / f"r{r}.pt"), json.loads((tmp / f"r{r}.pt.json").read_text()))
        for r in range(WORLD)
    ]


def job_spec(c: Controlled, codec: str, port: int, mode: str = "") -> str:
    job = c.create(WORLD, codec=codec, pool_size=16)
    name = f"{codec}/{mode}" if mode else codec
    return f"{name}:{job.job_id}:{job.token}:{port}"


def assert_same_params(a: dict, b: dict) -> None:
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=ATOL, rtol=RTOL, msg=lambda m, k=k: f"{k}: {m}")


def test_training_through_the_switch_equals_plain_ddp(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, join_timeout=RUN_S)
    try:
        procs = launch(
            c, tmp_path, [job_spec(c, "lossless", 41100), job_spec(c, "fixed_point", 41200)]
        )
        out = finish(procs, tmp_path, RUN_S)
    finally:
        c.close()
    for params, stats in out:
        for codec in ("lossless", "fixed_point"):
            assert stats[codec]["fallback_buckets"] == 0 and stats[codec]["warnings"] == [], stats
            assert stats[codec]["switch_buckets"] >= 10
            assert_same_params(params["plain"], params[codec])
    assert_same_params(out[0][0]["lossless"], out[1][0]["lossless"])  # ranks agree


def test_async_hook_and_dear_mode_through_the_switch_equal_plain_ddp(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, join_timeout=RUN_S)
    try:
        jobs = [job_spec(c, "lossless", 41400, "async"), job_spec(c, "fixed_point", 41500, "dear")]
        out = finish(launch(c, tmp_path, jobs), tmp_path, RUN_S)
    finally:
        c.close()
    for params, stats in out:
        for name in ("lossless/async", "fixed_point/dear"):
            assert stats[name]["fallback_buckets"] == 0 and stats[name]["warnings"] == [], stats
            assert stats[name]["switch_buckets"] >= 10
            assert_same_params(params["plain"], params[name])
    for name in ("lossless/async", "fixed_point/dear"):
        assert_same_params(out[0][0][name], out[1][0][name])  # ranks agree


def test_killed_switch_falls_back_to_gloo_and_warns_once(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, join_timeout=RUN_S)
    kill_dir = tmp_path / "kill"
    kill_dir.mkdir()
    try:
        procs = launch(c, tmp_path, [job_spec(c, "lossless", 41300)], kill_dir)
        try:
            wait_for(
                lambda: (kill_dir / "kill-me").exists() or any(p.poll() is not None for p in procs),
                RUN_S,
                "the ranks to reach the kill point",
            )
            c.fabric.switch.proc.kill()  # by PID, mid-training
            c.fabric.switch.proc.wait(5)
        finally:
            (kill_dir / "killed").write_text("")
        out = finish(procs, tmp_path, RUN_S)
    finally:
        c.close()
    for params, stats in out:
        s = stats["lossless"]
        assert s["switch_buckets"] > 0 and s["fallback_buckets"] > 0 and s["fallbacks"] >= 1, s
        assert len(s["warnings"]) == 1 and "falls back" in s["warnings"][0], s
        assert_same_params(params["plain"], params["lossless"])
