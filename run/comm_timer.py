"""How long DDP over gloo's all_reduces take per step: DDP's own all_reduce (torch's
default_hooks.allreduce_hook, what DDP runs without a hook) registered as a comm hook that
times each bucket from its launch to its result, so the dense models' communication can be
set beside the switch hook's time for the same buckets (bench/dense_comm.py)."""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


class AllreduceTimer:
    """Seconds DDP's all_reduces were in flight (summed over buckets) and buckets done."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.buckets = 0

    def attach(self, model: DistributedDataParallel) -> None:
        """Time the model's all_reduces from now on (dense gradients only: DDP's comm
        hooks take dense buckets)."""
        model.register_comm_hook(self, timed_allreduce)


def timed_allreduce(
    state: AllreduceTimer, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's all_reduce of one bucket (the mean over the ranks), its time added to state."""
    start = time.perf_counter()
    fut = default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.seconds += time.perf_counter() - start
        state.buckets += 1
        return f.value()

    return fut.then(done)
