"""The "homagg" torch.distributed backend: two ranks in their host namespaces (gloo and the
aggregation both through the reference switch) run a hand-written loop of all_reduce and
DDP without a hook; each result is right, the switch carried what it can, and the rest
(float64 MIN, integers beyond int32, all_gather) went to gloo. Plus the order-preserving
float key and which all_reduces the switch takes, in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from agent_fabric import Controlled

from testnet.namespace import have_privileges
from worker.backend import float_from_key, float_order_key, switch_kind

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("backend_worker.py")
WORLD = 2


def test_float_key_orders_like_the_floats():
    x = np.array([-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 3.4e38, np.inf], np.float32)
    k = float_order_key(x)
    assert np.all(np.diff(k.astype(np.int64)) >= 0)
    assert np.array_equal(float_from_key(k), x)
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=1000).astype(np.float32), rng.normal(size=1000).astype(np.float32)
    assert np.array_equal(
        float_from_key(np.maximum(float_order_key(a), float_order_key(b))), np.maximum(a, b)
    )


def test_switch_kind():
    s, mx, avg, mn = dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG, dist.ReduceOp.MIN
    f, i = torch.ones(3), torch.ones(3, dtype=torch.int32)
    assert [switch_kind(f, o) for o in (s, avg, mx, mn)] == ["codec", "codec", "max", ""]
    assert [switch_kind(i, o) for o in (s, mx, mn)] == ["add", "max", ""]
    assert switch_kind(torch.ones(2, dtype=torch.float64), s) == ""
    assert switch_kind(torch.ones(2).to_sparse(), s) == ""
    assert switch_kind(torch.ones(0), s) == ""


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
def test_backend_in_namespaces(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    procs, logs = [], []
    try:
        for r, host in enumerate(c.fabric.hosts[:WORLD]):
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "RANK": str(r),
                "WORLD_SIZE": str(WORLD),
                "MASTER_ADDR": c.fabric.hosts[0].ip,
                "MASTER_PORT": "29631",
                "GLOO_SOCKET_IFNAME": host.iface,
                "HOMAGG_CONTROLLER": c.address,
                "HOMAGG_IFACE": host.iface,
                "OMP_NUM_THREADS": "1",
            }
            cmd = ["ip", "netns", "exec", host.namespace, sys.executable, str(WORKER)]
            logs.append(tmp_path / f"r{r}.log")
            with open(logs[-1], "w") as f:
                procs.append(
                    subprocess.Popen(
                        [*cmd, str(tmp_path / f"r{r}.json")],
                        env=env,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + 120
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    finally:
        c.close()
    text = "\n".join(log.read_text()[-3000:] for log in logs)
    assert all(p.returncode == 0 for p in procs), text
    for r in range(WORLD):
        report = json.loads((tmp_path / f"r{r}.json").read_text())
        assert all(report["checks"].values()), report
        assert report["switch"] >= 5 + 4 and report["fallbacks"] == 0, (report, text)
