"""A hand-written data-parallel loop (no DDP): each rank computes its gradients and averages
them with dist.all_reduce, and counts its samples with an integer all_reduce. The process
group's backend is the only change for the switch: "homagg" instead of "gloo". Run it with
torchrun:

  HOMAGG_CONTROLLER=10.0.0.100:50051 HOMAGG_CA_FILE=ca.crt \\
  HOMAGG_OPERATOR_TOKEN_FILE=operator.token torchrun --nnodes 2 --nproc-per-node 1 \\
    --node-rank 0 --master-addr 10.0.0.1 examples/train_allreduce.py --steps 20

Float averages go through the switch's codec, the sample count exactly as integers; without
a controller the backend warns once and every all_reduce runs on gloo.
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch import nn

import homagg  # registers the "homagg" backend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--backend", default=homagg.BACKEND_NAME, help="homagg (default) or gloo")
    p.add_argument("--save", default="", help="rank 0 saves the final parameters here")
    args = p.parse_args()
    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    seen = torch.zeros(1, dtype=torch.int64)
    for step in range(args.steps):
        x = torch.randn(16 + rank, 20, generator=data)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad, op=dist.ReduceOp.AVG)
        opt.step()
        seen += x.shape[0]
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.all_reduce(seen)  # exact: an integer sum
    if rank == 0 and args.save:
        torch.save(model.state_dict(), args.save)
        stats = {"samples": int(seen)}
        if args.backend == homagg.BACKEND_NAME:
            stats["switch_calls"] = homagg.switch_group().state.stats.switch_buckets
        with open(args.save + ".json", "w") as f:
            json.dump(stats, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
