"""examples/train_allreduce.py, a hand-written loop on the "homagg" backend, run as torchrun
would by two ranks in their host namespaces through the reference switch: it ends at the
parameters of the same loop on gloo, its integer sample count exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from homagg.lab.controlled import Controlled, rank_env, run_in_hosts
from homagg.lab.namespace import have_privileges

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_allreduce.py"
WORLD, STEPS = 2, 8


def run_examples(c: Controlled, tmp: Path, runs: dict[str, int]) -> dict[str, str]:
    """Both ranks of the example for every backend: rendezvous port of `runs`, all at once on
    the same hosts; returns each backend's logs (asserting every rank exited 0 in time)."""
    argvs, envs, logs = [], [], []
    for backend, port in runs.items():
        envs += [rank_env(c, r, WORLD, port, controller=c.address) for r in range(WORLD)]
        argv = [str(EXAMPLE), "--steps", str(STEPS), "--backend", backend]
        argvs += [[*argv, "--save", str(tmp / f"{backend}.pt")]] * WORLD
        logs += [tmp / f"{backend}-r{r}.log" for r in range(WORLD)]
    hosts = [r for _ in runs for r in range(WORLD)]
    texts = [t[-3000:] for t in run_in_hosts(c, argvs, envs, logs, 120, hosts=hosts)]
    return {b: "\n".join(texts[i * WORLD : (i + 1) * WORLD]) for i, b in enumerate(runs)}


def test_loop_on_the_backend_equals_gloo(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:  # both at once, on the same hosts
        logs = run_examples(c, tmp_path, {"homagg": 29621, "gloo": 29622})["homagg"]
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
