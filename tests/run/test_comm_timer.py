"""run.comm_timer: DDP's own all_reduce, timed per bucket, still gives DDP's gradients."""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch.distributed as dist

# before init_process_group, as run/train.py (issue 31)
import torch.distributed.nn
from torch.nn.parallel import DistributedDataParallel as DDP

from run.comm_timer import AllreduceTimer


@pytest.mark.slow  # DDP's first construction in a process imports much of torch: seconds
def test_timer_counts_every_bucket_and_keeps_the_mean_gradient(tmp_path):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
        ref = [p.detach().clone() for p in net.parameters()]
        x = torch.randn(8, 64)
        model = DDP(net)  # one bucket: a small model
        timer = AllreduceTimer()
        timer.attach(model)
        for _ in range(2):
            model.zero_grad()
            model(x).square().sum().backward()
        grads = [p.grad.clone() for p in net.parameters()]
        plain = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
        with torch.no_grad():
            for p, r in zip(plain.parameters(), ref):
                p.copy_(r)
        plain(x).square().sum().backward()
        assert all(torch.allclose(g, p.grad) for g, p in zip(grads, plain.parameters()))
        assert timer.buckets == 2  # the bucket of each step
        assert timer.seconds > 0.0
    finally:
        del model
        gc.collect()
        dist.destroy_process_group()
