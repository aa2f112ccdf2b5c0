"""examples/train_ddp.py, an ordinary DDP script plus `homagg.attach`, run as torchrun would
(RANK, WORLD_SIZE, MASTER_ADDR in the environment) by two ranks inside their host
namespaces, gloo and the aggregation both through the reference switch: the switch run ends
at the parameters of the same script without a controller (gloo, one warning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from testnet.namespace import have_privileges

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from agent_fabric import Controlled

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
WORLD = 2


def run_example(c: Controlled, tmp: Path, tag: str, controller: str, port: int) -> list[str]:
    """Both ranks of the example; returns their logs (asserting they exited 0 in time)."""
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
            "HOMAGG_CONTROLLER": controller,
            "HOMAGG_IFACE": host.iface,  # the controller is on a Unix socket, not routed
            "OMP_NUM_THREADS": "1",
        }
        if not controller:
            del env["HOMAGG_CONTROLLER"]
        cmd = ["ip", "netns", "exec", host.namespace, sys.executable, str(EXAMPLE)]
        cmd += ["--steps", "8", "--save", str(tmp / f"{tag}.pt")]
        logs.append(tmp / f"{tag}-r{r}.log")
        with open(logs[-1], "w") as out:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 120
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    texts = [log.read_text() for log in logs]
    assert all(p.returncode == 0 for p in procs), "\n".join(t[-3000:] for t in texts)
    return texts


def test_example_through_the_switch_equals_gloo(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        switch_logs = run_example(c, tmp_path, "switch", c.address, 29611)
        gloo_logs = run_example(c, tmp_path, "gloo", "", 29612)
        jobs = c.client.list_jobs(include_ended=True).jobs
    finally:
        c.close()
    stats = json.loads((tmp_path / "switch.pt.json").read_text())
    assert stats["switch_buckets"] >= 8 and stats["fallbacks"] == 0, (stats, switch_logs)
    assert all("falls back" not in t for t in switch_logs)
    for t in gloo_logs:  # no controller: one clear warning per rank, then gloo
        assert t.count("homagg: rank") == 1 and "no controller: set HOMAGG_CONTROLLER" in t
    a, b = torch.load(tmp_path / "switch.pt"), torch.load(tmp_path / "gloo.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
    assert len(jobs) == 1 and jobs[0].state == "ended"  # released at exit
