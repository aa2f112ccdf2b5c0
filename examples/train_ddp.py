"""An ordinary DDP training script (a small recommender: sparse embeddings into a linear
scorer), put on the switch by the two lines marked "homagg". Run it with torchrun:

  HOMAGG_CONTROLLER=10.0.0.100:50051 HOMAGG_CA_FILE=ca.crt \\
  HOMAGG_OPERATOR_TOKEN_FILE=operator.token torchrun --nnodes 2 --nproc-per-node 1 \\
    --node-rank 0 --master-addr 10.0.0.1 examples/train_ddp.py --steps 20

Without a controller (HOMAGG_CONTROLLER unset) it warns once and trains over gloo; with
HOMAGG_ATTACH=0 it trains over gloo without a word. In the Mininet lab, through the switch
and then over gloo: make run SCRIPT=examples/train_ddp.py ARGS="--steps 40" (docs/run.md).
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg  # homagg (1/2)


class Recommender(nn.Module):
    """Users and items as sparse embeddings, scored by a dot product plus a bias layer."""

    def __init__(self, users: int = 500, items: int = 200, dim: int = 8) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim, sparse=True)
        self.item = nn.Embedding(items, dim, sparse=True)
        self.bias = nn.Linear(dim, 1)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        u, i = self.user(users), self.item(items)
        return (u * i).sum(1) + self.bias(u * i).squeeze(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save", default="", help="rank 0 saves the final parameters here")
    args = p.parse_args()
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Recommender())
    hook = homagg.attach(model)  # homagg (2/2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        users = torch.randint(0, 500, (32,), generator=data)
        items = torch.randint(0, 200, (32,), generator=data)
        labels = ((users + items) % 2).float()
        loss = nn.functional.binary_cross_entropy_with_logits(model(users, items), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0 and args.save:
        torch.save(model.module.state_dict(), args.save)
        stats = {
            "switch_buckets": hook.stats.switch_buckets,
            "fallbacks": hook.stats.fallbacks,
            "codec": hook.codec_name,
        }
        with open(args.save + ".json", "w") as f:
            json.dump(stats, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
