"""The collectives other than all_reduce under the homagg backend, each checked against
what the ranks' known inputs give: torch's current names (reduce_scatter_single,
all_gather_single, all_to_all_single), the deprecated ones scripts still call, the list
forms, point to point and the object collectives. Imported by backend_worker.py (through
the switch); run alone (argv: a JSON report path, a rendezvous file, rank, world) it is
one rank of test_backend.py's check without a controller (every call then over gloo)."""

import json
import sys

import torch
import torch.distributed as dist

import homagg  # registers "homagg"


def torch_collectives(rank: int, world: int) -> dict[str, bool]:
    """Every collective the backend hands to gloo, by its result."""
    c: dict[str, bool] = {}
    ranks = torch.arange(world, dtype=torch.float32)
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * world) * (rank + 1))
    c["reduce_scatter_tensor"] = out.tolist() == [
        float((2 * rank + i) * sum(range(1, world + 1))) for i in range(2)
    ]
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(rank + i)) for i in range(world)])
    c["reduce_scatter"] = out.tolist() == [float(world * rank + ranks.sum())] * 2
    gathered = torch.zeros(2 * world)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
    c["all_gather_into_tensor"] = torch.equal(gathered, ranks.repeat_interleave(2))
    parts = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([float(rank)]))
    c["all_gather"] = torch.equal(torch.cat(parts), ranks)
    got = torch.zeros(world)
    dist.all_to_all_single(got, torch.arange(world, dtype=torch.float32) + 10 * rank)
    c["all_to_all_single"] = torch.equal(got, ranks * 10 + rank)
    t = torch.tensor([float(rank)])
    dist.reduce(t, dst=0)
    c["reduce"] = rank != 0 or float(t) == float(ranks.sum())
    t = torch.zeros(1)
    dist.scatter(t, [torch.tensor([float(i)]) for i in range(world)] if rank == 0 else None, 0)
    c["scatter"] = float(t) == rank
    if world > 1:
        peer = 1 - rank if rank < 2 else None
        if peer is not None:
            t = torch.tensor([float(rank)])
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t + 100, 0)
            c["send and recv"] = float(t) == (100.0 if rank == 0 else 0.0)
    outs = [torch.zeros(2 * world) for _ in range(2)]
    with dist._coalescing_manager(async_ops=False):  # as FSDP gathers its shards
        for k, o in enumerate(outs):
            dist.all_gather_into_tensor(o, torch.full((2,), float(rank + k)))
    c["coalesced all_gather_into_tensor"] = all(
        torch.equal(o, (ranks + k).repeat_interleave(2)) for k, o in enumerate(outs)
    )
    outs = [torch.zeros(2) for _ in range(2)]
    with dist._coalescing_manager(async_ops=False):
        for k, o in enumerate(outs):
            dist.reduce_scatter_tensor(o, torch.full((2 * world,), float(k + 1)))
    c["coalesced reduce_scatter_tensor"] = all(
        o.tolist() == [float((k + 1) * world)] * 2 for k, o in enumerate(outs)
    )
    objs: list = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    c["all_gather_object"] = objs == [{"rank": r} for r in range(world)]
    dist.barrier()
    return c


def main() -> None:
    report, rendezvous, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group(
        "homagg", init_method=f"file://{rendezvous}", rank=rank, world_size=world
    )
    checks = torch_collectives(rank, world)
    backend = dist.get_backend()
    dist.destroy_process_group()
    with open(report, "w") as f:
        json.dump({"checks": checks, "backend": backend, "package": homagg.BACKEND_NAME}, f)


if __name__ == "__main__":
    main()
