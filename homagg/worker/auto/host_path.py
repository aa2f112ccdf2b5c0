"""codec="auto"'s host path as DDP's own: a bucket the controller sends to the host is
all-reduced from the hook itself, through the process group DDP uses, exactly as DDP over
gloo does without a hook, instead of queueing behind the communication thread. Its cost
(issue to completion) is recorded for the controller before the step's decision.

Every rank takes the same path for every bucket because the choice is read only after the
step before's decision is complete (`wait_decided`), and the decision runs on the
communication thread after the step's last bucket: the two never race. The host
all_reduces go through DDP's process group from the thread that runs backward (as DDP's
own), the communication thread's collectives through the hook's own group, so no group
sees collectives from two threads (docs/worker.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from homagg.worker.auto.control import HOST, AutoController, Choice

# A step's decision not done this long after its last bucket: a rank is gone or stuck.
DECISION_TIMEOUT_S = 300.0


@dataclass
class _Pending:
    index: int
    start: float
    nonzero: float
    done: torch.futures.Future  # completes with the completion time (perf_counter)


@dataclass
class AutoHostPath:
    """The buckets of this step that took the host path from the hook, and whether the
    controller's choices for the next bucket are final."""

    controller: AutoController
    pending: list[_Pending] = field(default_factory=list)
    decided: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.decided.set()  # nothing to decide before the first step

    def wait_decided(self) -> None:
        """Block until the step before's decision is complete (normally long since)."""
        if not self.decided.wait(DECISION_TIMEOUT_S):
            raise RuntimeError(
                f"homagg: codec='auto' had no decision {DECISION_TIMEOUT_S:.0f} s after the "
                "step's last bucket: a rank stopped or its communication thread is stuck"
            )

    def deciding(self) -> None:
        """The step's last bucket is handed over: choices wait for the decision."""
        self.decided.clear()

    def is_host(self, index: int) -> bool:
        """Whether bucket `index` takes the host path this step (once the step before's
        decision is complete)."""
        self.wait_decided()
        return self.controller.choice(index).method == HOST

    def issue(
        self,
        index: int,
        buf: torch.Tensor,
        all_reduce: Callable[[torch.Tensor], dist.Work],
        world_size: int,
    ) -> torch.futures.Future[torch.Tensor]:
        """Bucket `index` SUM-all-reduced by `all_reduce` (started now, asynchronous),
        divided by the world size when it completes; its nonzero share is taken before
        (while the controller still needs it: this rank's gradient, MAX over ranks in the
        agreement)."""
        nonzero = 1.0 if self.controller.known(index) else nonzero_share(buf)
        start = time.perf_counter()
        work = all_reduce(buf)
        stamped = work.get_future().then(lambda _: time.perf_counter())
        self.pending.append(_Pending(index, start, nonzero, stamped))
        return work.get_future().then(lambda fut: fut.value()[0].div_(world_size))

    def record(self) -> None:
        """Wait for this step's host buckets and give the controller their costs (the
        communication thread, before the step's decision). A bucket's cost is the time the
        host path spent on it alone: from its issue, or from the bucket before's completion
        when later, to its completion. The group runs its all_reduces in issue order, so
        issue to completion would also count the wait behind the buckets before it (on NCF
        three buckets issued at once measured 40-60 ms each in a 70 ms step), while the
        switch path's costs, one bucket after the other on one thread, do not."""
        free = 0.0  # when the bucket before completed
        for p in self.pending:
            done = float(p.done.wait())
            cost = max(0.0, done - max(p.start, free))
            free = max(free, done)
            self.controller.record(p.index, cost, Choice(HOST), p.nonzero)
        self.pending.clear()


def nonzero_share(buf: torch.Tensor) -> float:
    """The share of a bucket's elements that are nonzero (a sparse bucket's rows)."""
    if buf.is_sparse:
        return min(1.0, buf._nnz() / max(1, buf.shape[0]))
    return float(torch.count_nonzero(buf)) / max(1, buf.numel())
