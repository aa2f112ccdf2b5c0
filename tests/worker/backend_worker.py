"""One rank of tests/worker/test_backend.py: init_process_group("homagg"), a hand-written
loop of all_reduce (float SUM/AVG/MAX, integer SUM/MAX, others delegated) and DDP without a
hook; checks every result against what the ranks' known inputs give, writes a JSON report."""

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import worker.backend  # noqa: F401  (registers "homagg")


def data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def main() -> None:
    dist.init_process_group("homagg")
    rank, world = dist.get_rank(), dist.get_world_size()
    xs = [torch.linspace(-1, 1, 1000) * (r + 1) for r in range(world)]
    checks = {}
    t = xs[rank].clone()
    dist.all_reduce(t)
    checks["float sum"] = torch.allclose(t, sum(xs), atol=1e-5)
    t = xs[rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    checks["float avg"] = torch.allclose(t, sum(xs) / world, atol=1e-5)
    t = -xs[rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    checks["float max"] = torch.equal(t, torch.stack([-x for x in xs]).max(0).values)
    ints = [torch.arange(-50, 50, dtype=torch.int64) * (r + 2) for r in range(world)]
    t = ints[rank].clone()
    dist.all_reduce(t)
    checks["int sum"] = torch.equal(t, sum(ints))
    t = ints[rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    checks["int max"] = torch.equal(t, torch.stack(ints).max(0).values)
    t = torch.full((4,), 2**40 if rank == 0 else 1, dtype=torch.int64)  # beyond int32: gloo
    dist.all_reduce(t)
    checks["big ints via gloo"] = bool((t == 2**40 + 1).all())
    t = torch.tensor([float(rank + 1)], dtype=torch.float64)  # float64: gloo, exact
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    checks["min via gloo"] = float(t) == 1.0
    objs = [None] * world
    dist.all_gather_object(objs, rank)
    checks["all_gather delegated"] = objs == list(range(world))
    m = DDP(model())  # no hook: DDP's own all_reduce is the backend's
    ref = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        x, y = data(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(
            nn.functional.mse_loss(ref(a), b) for a, b in (data(r, step) for r in range(world))
        )
        (loss / world).backward()
        ref_opt.step()
    checks["ddp"] = all(
        torch.allclose(a, b, atol=1e-5) for a, b in zip(m.parameters(), ref.parameters())
    )
    pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    stats = pg.state.stats
    report = {
        "checks": checks,
        "switch": stats.switch_buckets,
        "fallbacks": stats.fallbacks,
        "reasons": dict(stats.fallback_reasons),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
