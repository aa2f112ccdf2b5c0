"""examples/train_allreduce.py, a hand-written loop on the "homagg" backend, run as torchrun
would by two ranks in their host namespaces through the reference switch: it ends at the
parameters of the same loop on gloo, its integer sample count exact."""

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
EXAMPLE = ROOT / "examples" / "train_allreduce.py"
WORLD, STEPS = 2, 8


def run_example(c: Controlled, tmp: Path, backend: str, port: int) -> str:
    """Both ranks of the example; returns their logs (asserting they exited 0 in time)."""
    assert c.fabric is not None
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
            "HOMAGG_CONTROLLER": c.address,
            "HOMAGG_IFACE": host.iface,  # the controller is on a Unix socket, not routed
            "OMP_NUM_THREADS": "1",
        }
        cmd = ["ip", "netns", "exec", host.namespace, sys.executable, str(EXAMPLE)]
        cmd += ["--steps", str(STEPS), "--backend", backend, "--save", str(tmp / f"{backend}.pt")]
        logs.append(tmp / f"{backend}-r{r}.log")
        with open(logs[-1], "w") as out:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 120
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    text = "\n".join(log.read_text()[-3000:] for log in logs)
    assert all(p.returncode == 0 for p in procs), text
    return text


def test_loop_on_the_backend_equals_gloo(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        logs = run_example(c, tmp_path, "homagg", 29621)
        run_example(c, tmp_path, "gloo", 29622)
        jobs = c.client.list_jobs(include_ended=True).jobs
    finally:
        c.close()
    stats = json.loads((tmp_path / "homagg.pt.json").read_text())
    assert "falls back" not in logs
    # 4 gradients per step and the sample count, all on the switch
    assert stats["switch_calls"] == 4 * STEPS + 1, (stats, logs)
    assert stats["samples"] == sum(16 + r for r in range(WORLD)) * STEPS
    assert json.loads((tmp_path / "gloo.pt.json").read_text())["samples"] == stats["samples"]
    a, b = torch.load(tmp_path / "homagg.pt"), torch.load(tmp_path / "gloo.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
    assert len(jobs) == 1 and jobs[0].state == "ended"  # released at destroy_process_group
