"""run.peers: each peer method a user would pick instead of the switch trains a real DDP
model over gloo (a 2-rank process group on loopback) and matches what it claims."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from run import peers
from run.model import JobShape, make_task

SHAPE = JobShape(users=200, items=50, dim=8, batch=32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, mode: str, model: str, out: str) -> None:
    # gloo on loopback, as the other in-process tests: without an interface gloo looks up
    # the host name, which a sandbox's resolver may fail (c10d's "hostname cannot be retrieved")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        task = make_task(model, SHAPE)
        peers.prepare(mode, task.model)
        ddp = DDP(task.model)
        steps = 6
        peers.attach(mode, ddp, steps)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        sparse = []
        for step in range(steps):
            *inputs, labels = task.batch(rank, step)
            opt.zero_grad()
            task.loss(ddp(*inputs), labels).backward()
            sparse.append(any(p.grad is not None and p.grad.is_sparse for p in ddp.parameters()))
            opt.step()
        if rank == 0:
            torch.save({"state": ddp.module.state_dict(), "sparse": sparse}, out)
    finally:
        dist.destroy_process_group()


def _train(mode: str, model: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{mode}-{model}.pt"
    mp.start_processes(
        _rank, args=(_free_port(), mode, model, str(out)), nprocs=2, start_method="spawn"
    )
    return torch.load(out)


def test_modes_are_the_peers_plus_switch_and_gloo() -> None:
    assert ("switch", "gloo", *peers.PEERS) == peers.MODES
    assert peers.powersgd_start(80) == 8 and peers.powersgd_start(5) == 2


def test_unknown_peer_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown peer mode"):
        peers.attach("gloo-bogus", None, 10)  # type: ignore[arg-type]


def test_dense_needs_sparse_embeddings() -> None:
    with pytest.raises(ValueError, match="embedding"):
        peers.prepare("gloo-dense", torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="embedding"):
        peers.prepare("gloo-dense", make_task("lm", SHAPE).model)  # dense tables already


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dense_gloo_matches_sparse_gloo(tmp_path: Path) -> None:
    """Dense tables over gloo sum exactly what the sparse rows do (up to float rounding)."""
    sparse = _train("gloo", "ncf", tmp_path)
    dense = _train("gloo-dense", "ncf", tmp_path)
    assert all(sparse["sparse"]) and not any(dense["sparse"])
    for k, v in dense["state"].items():
        assert torch.allclose(v, sparse["state"][k], atol=1e-6), k


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["gloo-fp16", "gloo-powersgd1"])
def test_compression_hooks_train_close_to_gloo(mode: str, tmp_path: Path) -> None:
    """fp16 and PowerSGD change the result, a little (PowerSGD starts after its warm-up)."""
    ref = _train("gloo", "mlp", tmp_path)["state"]
    got = _train(mode, "mlp", tmp_path)["state"]
    diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    assert 0 < diff < 0.05


def test_make_run_takes_known_peers_and_refuses_others() -> None:
    """`python -m run --peers` keeps the order given and names the valid ones on a typo."""
    from run.options import parser, settle

    args = parser().parse_args(["--peers", "gloo-fp16,gloo-powersgd4", "--target", "refswitch"])
    settle(args)
    assert args.peer_list == ["gloo-fp16", "gloo-powersgd4"]
    bad = parser().parse_args(["--peers", "gloo-fp16,gloo-fp8", "--target", "refswitch"])
    with pytest.raises(ValueError, match="gloo-fp8: expected some of gloo-dense"):
        settle(bad)
