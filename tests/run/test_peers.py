"""run.peers: each peer method a user would pick instead of the switch trains a real DDP
model over gloo (a 2-rank process group on loopback) and matches what it claims."""

from __future__ import annotations

import gc
import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

# before init_process_group, as run/train.py: imported later (by DDP) it keeps the world
# group alive until interpreter exit (issue 31)
import torch.distributed.nn
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from run import peers
from run.model import JobShape, make_task

SHAPE = JobShape(users=200, items=50, dim=8, batch=32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every (mode, model) the tests compare, trained one after the other by the same two ranks
# (spawned once per module: the fixture `trained`; make_task seeds each model alike).
RUNS = (("gloo", "ncf"), ("gloo-dense", "ncf"), ("gloo", "mlp"))
RUNS += (("gloo-fp16", "mlp"), ("gloo-powersgd1", "mlp"))


def _rank(rank: int, port: int, out: str) -> None:
    # gloo on loopback, as the other in-process tests: without an interface gloo looks up
    # the host name, which a sandbox's resolver may fail (c10d's "hostname cannot be retrieved")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        for mode, model in RUNS:
            _train_one(rank, mode, model, Path(out) / f"{mode}-{model}.pt")
        dist.barrier()  # as run/train.py: no rank tears gloo down while its peer still talks
    finally:
        # DDP and its hooks' states sit in reference cycles that hold the world group: freed
        # here, destroy_process_group is the group's last reference and gloo's threads stop
        # now, not in interpreter finalization ("terminate called without an active exception")
        gc.collect()
        dist.destroy_process_group()


def _train_one(rank: int, mode: str, model: str, out: Path) -> None:
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


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict]:
    """Rank 0's final state (and which steps had sparse gradients) of every RUNS entry, from
    one pair of spawned ranks (spawning and importing torch once, not once per run)."""
    out = tmp_path_factory.mktemp("peers")
    mp.start_processes(_rank, args=(_free_port(), str(out)), nprocs=2, start_method="spawn")
    return {(mode, model): torch.load(out / f"{mode}-{model}.pt") for mode, model in RUNS}


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
@pytest.mark.timeout(240)
def test_dense_gloo_matches_sparse_gloo(trained: dict) -> None:
    """Dense tables over gloo sum exactly what the sparse rows do (up to float rounding)."""
    sparse, dense = trained["gloo", "ncf"], trained["gloo-dense", "ncf"]
    assert all(sparse["sparse"]) and not any(dense["sparse"])
    for k, v in dense["state"].items():
        assert torch.allclose(v, sparse["state"][k], atol=1e-6), k


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["gloo-fp16", "gloo-powersgd1"])
def test_compression_hooks_train_close_to_gloo(mode: str, trained: dict) -> None:
    """fp16 and PowerSGD change the result, a little (PowerSGD starts after its warm-up)."""
    ref, got = trained["gloo", "mlp"]["state"], trained[mode, "mlp"]["state"]
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
