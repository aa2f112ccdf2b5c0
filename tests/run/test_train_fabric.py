"""make run's training script (run/train.py, the NCF recommender with sparse embeddings) run
by two ranks inside their host namespaces, gloo and aggregation both through the reference
switch, without Mininet: the switch run (lossless codec, sparse buckets handed over as
indices and values) ends at the parameters of DDP over gloo with sparse embeddings, within
the fixed-point bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from homagg.lab.controlled import Controlled, rank_env, run_in_hosts
from homagg.lab.namespace import have_privileges
from run import report

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
ROOT = Path(__file__).resolve().parents[2]
WORLD, STEPS, LR = 2, 6, 3.0


def train(c: Controlled, out: Path, mode: str, port: int) -> None:
    assert c.fabric is not None
    envs = [rank_env(c, r, WORLD, port) for r in range(WORLD)]
    argvs = []
    for host in c.fabric.hosts[:WORLD]:
        argv = ["-m", "run.train", "--mode", mode, "--steps", str(STEPS), "--users", "2000"]
        argv += ["--items", "400", "--lr", str(LR), "--iface", host.iface, "--out", str(out)]
        argvs.append([*argv, "--pool-size", "16", "--controller", c.address])
    run_in_hosts(c, argvs, envs, [out / f"{mode}-r{r}.log" for r in range(WORLD)], 150)


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
