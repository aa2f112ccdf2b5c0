"""make run's training script (run/train.py, the NCF recommender with sparse embeddings) run
by two ranks inside their host namespaces, gloo and aggregation both through the reference
switch, without Mininet: the switch run (lossless codec, sparse buckets handed over as
indices and values) ends at the parameters of DDP over gloo with sparse embeddings, within
the fixed-point bound."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run import report
from testnet.namespace import have_privileges

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from agent_fabric import Controlled

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
ROOT = Path(__file__).resolve().parents[2]
WORLD, STEPS, LR = 2, 6, 3.0


def train(c: Controlled, out: Path, mode: str, port: int) -> None:
    procs, logs = [], []
    for r, host in enumerate(c.fabric.hosts[:WORLD]):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RANK": str(r),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": c.fabric.hosts[0].ip,
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": host.iface,
            "HOMAGG_IFACE": host.iface,  # the controller is on a Unix socket, not routed
            "OMP_NUM_THREADS": "1",
        }
        cmd = ["ip", "netns", "exec", host.namespace, sys.executable, "-m", "run.train"]
        cmd += ["--mode", mode, "--steps", str(STEPS), "--users", "2000", "--items", "400"]
        cmd += ["--lr", str(LR), "--iface", host.iface, "--out", str(out), "--pool-size", "16"]
        cmd += ["--controller", c.address]
        logs.append(out / f"{mode}-r{r}.log")
        with open(logs[-1], "w") as f:
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 150
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    assert all(p.returncode == 0 for p in procs), "\n".join(log.read_text()[-3000:] for log in logs)


def test_sparse_recommender_switch_equals_gloo(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        train(c, tmp_path, "switch", 29621)
        train(c, tmp_path, "gloo", 29622)
    finally:
        c.close()
    steps = report.read_steps(tmp_path / "switch.jsonl")
    assert len(steps) == STEPS and sum(s["fallback_buckets"] for s in steps) == 0
    assert all(s["agg_dense"] > 0 for s in steps)
    diff = report.compare(tmp_path / "switch.pt", tmp_path / "gloo.pt")
    bound = report.fixed_point_bound(steps, WORLD, LR)
    assert 0 <= diff <= bound, (diff, bound)
