"""examples/train_ddp.py, an ordinary DDP script plus `homagg.attach`, run as torchrun would
(RANK, WORLD_SIZE, MASTER_ADDR in the environment) by two ranks inside their host
namespaces, gloo and the aggregation both through the reference switch: the switch run ends
at the parameters of the same script without a controller (gloo, one warning)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from testnet.namespace import have_privileges

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from agent_fabric import Controlled, rank_env, run_in_hosts

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
WORLD = 2


def run_example(c: Controlled, tmp: Path, tag: str, controller: str, port: int) -> list[str]:
    """Both ranks of the example; returns their logs (asserting they exited 0 in time)."""
    envs = [rank_env(c, r, WORLD, port, controller=controller) for r in range(WORLD)]
    argv = [str(EXAMPLE), "--steps", "8", "--save", str(tmp / f"{tag}.pt")]
    logs = [tmp / f"{tag}-r{r}.log" for r in range(WORLD)]
    return run_in_hosts(c, [argv] * WORLD, envs, logs, 120)


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
