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

from homagg.worker.ddp.dear import DearDataParallel

STEPS = 12


class AttentionNet(nn.Module):
    """Embeddings, self-attention, an MLP. nn.MultiheadAttention uses its out_proj's
    parameters without calling out_proj: DeAR must update them before the attention runs."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16, sparse=sparse)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.mlp(h + a)


def make_model(opt_name: str) -> nn.Module:
    torch.manual_seed(0)
    return AttentionNet(sparse=opt_name == "sgd-sparse")


def make_opt(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    if name == "sgd-sparse":  # sparse embedding gradients (plain SGD takes them)
        return torch.optim.SGD(params, lr=0.05)
    return torch.optim.Adam(params, lr=1e-2)


def batches(rank: int):
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(STEPS):
        yield torch.randint(0, 50, (8, 3), generator=gen), torch.randn(8, 4, generator=gen)


def run_ddp(rank: int, opt_name: str) -> dict:
    model = DDP(make_model(opt_name))
    opt = make_opt(opt_name, model.parameters())
    for x, y in batches(rank):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.clone() for k, v in model.module.state_dict().items()}


def run_dear(rank: int, opt_name: str, candidates: list[int]) -> tuple[dict, dict]:
    model = make_model(opt_name)
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
    for opt_name in ("sgd", "adam", "sgd-sparse"):
        results[f"ddp-{opt_name}"] = run_ddp(a.rank, opt_name)
        # candidates smaller than the model: several buckets, tuned over three sizes
        results[f"dear-{opt_name}"], infos[opt_name] = run_dear(a.rank, opt_name, [512, 2048, 8192])
    torch.save(results, a.out)
    with open(a.out + ".json", "w") as f:
        json.dump(infos, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
