"""The asynchronous DDP hook: each bucket is handed to the rank's communication thread and a
pending Future returned at once, so aggregation overlaps the rest of backward; codec="auto"'s
host buckets are all-reduced from the hook itself, as DDP's own (auto/host_path.py)."""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from homagg.worker.auto.control import HOST
from homagg.worker.ddp.comm_thread import CommThread
from homagg.worker.ddp.switch_path import aggregate_bucket

if TYPE_CHECKING:
    from homagg.worker.ddp.hook import SwitchHookState


def asynchronous_hook(
    state: "SwitchHookState", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: a pending Future at once, completed by the rank's communication thread
    with the bucket's gradients summed through the switch (or, agreed by every rank, by the
    process group's all_reduce) and divided by the world size."""
    buf = bucket.buffer()
    comm = state.start_comm()
    index, last = bucket.index(), bucket.is_last()
    budgets = state.hand_over(index, last)
    fut = _issue(state, comm, index, buf, last)
    if last:  # after the last bucket's Future completes, on the same thread
        if state.auto_host is not None:
            state.auto_host.deciding()
        comm.submit(lambda: state.end_step(budgets))
    return fut


def _issue(
    state: "SwitchHookState", comm: CommThread, index: int, buf: torch.Tensor, last: bool
) -> torch.futures.Future[torch.Tensor]:
    """Bucket `index` queued for the communication thread, or, when codec="auto" sends it
    to the host this step, all-reduced from here as DDP's own."""
    host = state.auto_host
    if host is not None and host.is_host(index):
        state.stats.host_buckets += 1
        state.stats.auto_choices[HOST] += 1
        return host.issue(index, buf, state.host_all_reduce_async, state.world_size)
    return comm.submit(lambda: aggregate_bucket(state, index, buf, last))
