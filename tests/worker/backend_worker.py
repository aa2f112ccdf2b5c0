"""One rank of tests/worker/test_backend.py: init_process_group("homagg"), then all_reduce
calls (float SUM/AVG/MAX, integer SUM/MAX at the int32 cells' edges, sparse SUM, others
delegated), a hand-written training loop that averages gradients with dist.all_reduce, and
DDP without a hook on a model with a sparse embedding. Checks every result against what the
ranks' known inputs give and writes a JSON report (argv[1]). With a directory as argv[2],
the rank stops after the calls until the test has released the job under it (a failure
in mid-run: the loops then fall back to gloo)."""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg  # registers "homagg"
from homagg.worker.ddp.backend import switch_group
from tests.worker.backend_collectives_worker import torch_collectives

ATOL = 1e-5  # lossless fixed point: far below this at these magnitudes (W = 2)
STEPS = 4


class Model(nn.Module):
    """A sparse embedding (its gradient a COO tensor) into a small dense net."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 4, sparse=True)
        self.net = nn.Sequential(nn.Linear(6 + 4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([self.emb(ids), x], 1))


def data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(0, 50, (16,), generator=g)
    return ids, torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)


def loss_of(m: nn.Module, rank: int, step: int) -> torch.Tensor:
    ids, x, y = data(rank, step)
    return nn.functional.mse_loss(m(ids, x), y)


def reference(world: int) -> nn.Module:
    """The same training on one process: the loss averaged over every rank's data."""
    ref = Model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        torch.stack([loss_of(ref, r, step) for r in range(world)]).mean().backward()
        opt.step()
    return ref


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.allclose(p, q, atol=ATOL) for p, q in zip(a.parameters(), b.parameters()))


def reduced(t: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t, op=op)
    return t


def collectives(rank: int, world: int) -> dict[str, bool]:
    """all_reduce of every kind the backend sorts, each checked exactly or within ATOL."""
    c = {}
    xs = [torch.linspace(-1, 1, 1000) * (r + 1) for r in range(world)]
    total = torch.stack(xs).sum(0)
    c["float sum"] = torch.allclose(reduced(xs[rank]), total, atol=ATOL)
    p = nn.Parameter(xs[rank].clone())  # a leaf that requires grad, written as gloo does
    dist.all_reduce(p.data)
    dist.all_reduce(p)
    c["parameter sum"] = torch.allclose(p.detach(), total * world, atol=ATOL)
    c["float avg"] = torch.allclose(reduced(xs[rank], dist.ReduceOp.AVG), total / world, atol=ATOL)
    neg = torch.stack([-x for x in xs])
    c["float max"] = torch.equal(reduced(neg[rank], dist.ReduceOp.MAX), neg.max(0).values)
    half = reduced(xs[rank].half(), dist.ReduceOp.MAX)
    c["half max"] = torch.equal(half, torch.stack([x.half() for x in xs]).max(0).values)
    ints = [torch.arange(-50, 50, dtype=torch.int64) * (r + 2) for r in range(world)]
    c["int sum"] = torch.equal(reduced(ints[rank]), torch.stack(ints).sum(0))
    c["int max"] = torch.equal(
        reduced(ints[rank], dist.ReduceOp.MAX), torch.stack(ints).max(0).values
    )
    edge = (2**31 - 1) // world  # the largest |x| whose sum over the ranks stays in int32
    t = torch.tensor([edge, -edge, rank], dtype=torch.int32)
    c["int32 edge sum"] = reduced(t).tolist() == [edge * world, -edge * world, sum(range(world))]
    t = torch.tensor([2**31 - 1, -(2**31) + 1, rank], dtype=torch.int32)
    c["int32 edge max"] = reduced(t, dist.ReduceOp.MAX).tolist() == [
        2**31 - 1,
        -(2**31) + 1,
        world - 1,
    ]
    t = torch.full((4,), 2**40 if rank == 0 else 1, dtype=torch.int64)  # beyond int32: gloo
    c["big ints via gloo"] = bool((reduced(t) == 2**40 + 1).all())
    t = (
        torch.tensor([-(2**63), 1], dtype=torch.int64)
        if rank == 0
        else torch.zeros(2, dtype=torch.int64)
    )
    c["int64 min via gloo"] = reduced(t, dist.ReduceOp.MAX).tolist() == [0, 1]
    t = torch.tensor([float(rank + 1)], dtype=torch.float64)  # float64 MIN: gloo, exact
    c["min via gloo"] = float(reduced(t, dist.ReduceOp.MIN)) == 1.0
    rows = [torch.tensor([[r, 7]]) for r in range(world)]
    sp = [
        torch.sparse_coo_tensor(i, torch.ones(2, 3) * (r + 1), (10, 3)) for r, i in enumerate(rows)
    ]
    got = reduced(sp[rank])
    c["sparse sum"] = got.is_sparse and torch.allclose(
        got.to_dense(), torch.stack([s.to_dense() for s in sp]).sum(0), atol=ATOL
    )
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG)
        c["int avg refused"] = False
    except ValueError:
        c["int avg refused"] = True
    objs: list = [None] * world
    dist.all_gather_object(objs, rank)
    c["all_gather delegated"] = objs == list(range(world))
    b = torch.tensor([rank])
    dist.broadcast(b, src=world - 1)
    c["broadcast delegated"] = int(b) == world - 1
    return c | torch_collectives(rank, world)


def hand_loop(rank: int, world: int, ref: nn.Module) -> bool:
    """A training loop with no DDP: each gradient averaged by dist.all_reduce(AVG)."""
    m = Model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(m, rank, step).backward()
        for p in m.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
    return same(m, ref)


def ddp_loop(rank: int, ref: nn.Module) -> bool:
    """DDP with no comm hook: its bucket all_reduces are the backend's."""
    m = DDP(Model())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(m, rank, step).backward()
        opt.step()
    return same(m.module, ref)


def timing(reps: int = 3) -> dict[str, dict[str, float]]:
    """Seconds per all_reduce of n float32, through the backend and through its gloo."""
    pg = switch_group()
    out: dict[str, dict[str, float]] = {}
    for n in (1 << 10, 1 << 14, 1 << 16):
        t = torch.ones(n)
        row = out[str(n)] = {}
        for name, run in (
            ("homagg", lambda t=t: dist.all_reduce(t)),
            ("gloo", lambda t=t: pg.gloo.allreduce([t]).wait()),
        ):
            run()
            start = time.perf_counter()
            for _ in range(reps):
                run()
            row[name] = round((time.perf_counter() - start) / reps, 4)
    return out


def main() -> None:
    dist.init_process_group("homagg")
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = reference(world)
    checks = collectives(rank, world)
    if len(sys.argv) > 2:
        pause = Path(sys.argv[2])
        (pause / f"ready-{rank}").write_text("")
        deadline = time.monotonic() + 60
        while not (pause / "released").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    checks["hand-written loop"] = hand_loop(rank, world, ref)
    checks["ddp"] = ddp_loop(rank, ref)
    pg = switch_group()
    stats = pg.state.stats
    report = {
        "checks": checks,
        "switch": stats.switch_buckets,
        "fallbacks": stats.fallbacks,
        "reasons": dict(stats.fallback_reasons),
        "gloo_calls": dict(pg.gloo_calls),
        "seconds": timing() if os.environ.get("HOMAGG_CONTROLLER") else {},
        "backend": dist.get_backend(),
        "exported": homagg.BACKEND_NAME,
    }
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and os.environ.get("HOMAGG_CONTROLLER"):
        from homagg.api.client import ControllerClient

        with ControllerClient(os.environ["HOMAGG_CONTROLLER"], timeout=5.0) as client:
            jobs = client.list_jobs(include_ended=True).jobs
        report["jobs_after_destroy"] = [j.state for j in jobs]
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
