"""One rank of test_dear.py (a subprocess): the same model and data trained by DDP over
gloo and by DearDataParallel (gloo aggregation), with SGD + momentum and with Adam; saves
both final parameter sets and DeAR's bucket report."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from worker.dear import DearDataParallel

STEPS = 12


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(50, 16), nn.Flatten(), nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 4)
    )


def make_opt(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    return torch.optim.Adam(params, lr=1e-2)


def batches(rank: int):
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(STEPS):
        yield torch.randint(0, 50, (8, 3), generator=gen), torch.randn(8, 4, generator=gen)


def run_ddp(rank: int, opt_name: str) -> dict:
    model = DDP(make_model())
    opt = make_opt(opt_name, model.parameters())
    for x, y in batches(rank):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.clone() for k, v in model.module.state_dict().items()}


def run_dear(rank: int, opt_name: str, candidates: list[int]) -> tuple[dict, dict]:
    model = make_model()
    dear = DearDataParallel(
        model, make_opt(opt_name, model.parameters()), candidates=candidates, tune_steps=2
    )
    for x, y in batches(rank):
        nn.functional.mse_loss(dear(x), y).backward()
    dear.flush()
    info = {
        "chosen": dear.tuner.chosen,
        "buckets": len(dear.buckets),
        "report": {str(k): v for k, v in dear.tuner.report().items()},
    }
    dear.close()
    return {k: v.clone() for k, v in model.state_dict().items()}, info


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(a.store, a.world),
        rank=a.rank,
        world_size=a.world,
        timeout=timedelta(seconds=60),
    )
    results, infos = {}, {}
    for opt_name in ("sgd", "adam"):
        results[f"ddp-{opt_name}"] = run_ddp(a.rank, opt_name)
        # candidates smaller than the model: several buckets, tuned over three sizes
        results[f"dear-{opt_name}"], infos[opt_name] = run_dear(a.rank, opt_name, [512, 2048, 8192])
    torch.save(results, a.out)
    with open(a.out + ".json", "w") as f:
        json.dump(infos, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
