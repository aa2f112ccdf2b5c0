"""One rank of test_sparse_bucket.py's SparseAdam case (a subprocess): an embedding with
sparse gradients trained by SparseAdam, once with DDP over gloo and once with the switch
hook (lossless) over a switch simulated by gloo collectives. Steps after the first name rows
whose sum is zero (rows that cancel between the ranks, a row of zeros): gloo keeps them, so
SparseAdam decays their moments and moves them. Writes parameters and optimizer state of
both runs (argv: rank, store file, output file)."""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from auto_worker import Agent, GlooSwitch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook

# (rank, step) -> (rows looked up, the weight of each in the loss); the gradient of a row is
# its weight times ones, exact in the codec's fixed point
DATA = {
    (0, 0): ([1, 2, 3], [1.0, 1.0, 1.0]),
    (1, 0): ([1, 2, 3, 4], [2.0, 2.0, 2.0, 2.0]),
    (0, 1): ([2, 3, 5], [0.0, 1.0, 1.0]),  # row 2: zeros; row 3 cancels with rank 1's
    (1, 1): ([3, 6], [-1.0, 1.0]),
    (0, 2): ([1, 4, 4], [0.5, 1.0, -1.0]),  # row 4 cancels within rank 0
    (1, 2): ([1, 7], [-0.5, 1.0]),  # row 1 cancels between the ranks
}


def train(rank: int, hooked: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4, sparse=True)
    model = DDP(emb)
    if hooked:
        state = SwitchHookState(Agent(GlooSwitch(dist.new_group(backend="gloo"))))
        model.register_comm_hook(state, switch_allreduce_hook)
    opt = torch.optim.SparseAdam(model.parameters(), lr=0.1)
    for step in range(3):
        rows, weights = DATA[(rank, step)]
        opt.zero_grad()
        out = model(torch.tensor(rows))
        (out * torch.tensor(weights)[:, None]).sum().backward()
        opt.step()
    st = opt.state[emb.weight]
    if hooked:
        assert state.stats.switch_buckets == 3 and state.stats.fallback_buckets == 0
    return {
        "weight": emb.weight.detach().clone(),
        "exp_avg": st["exp_avg"],
        "exp_avg_sq": st["exp_avg_sq"],
    }


def main() -> None:
    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=timedelta(60)
    )
    rows, weights = DATA[(rank, 1)]  # what gloo's sparse all_reduce returns, as is
    t = torch.sparse_coo_tensor([rows], torch.tensor(weights)[:, None].repeat(1, 4), (10, 4))
    dist.all_reduce(t)
    gloo = train(rank, hooked=False)
    switch = train(rank, hooked=True)
    if rank == 0:
        torch.save({"gloo": gloo, "switch": switch, "gloo_sum": t}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
