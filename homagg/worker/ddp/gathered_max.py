"""A MAX over the ranks by one all_gather, for the agreements' vectors (the fallback's
`GlooVerdict`, the step's seal, codec="auto"'s decision): they are a few int64 cells, so
what such a collective costs is its hops, each a wake-up of the next rank. gloo's all_gather
is a ring of W - 1 hops where its all_reduce takes 2 (W - 1) (reduce-scatter, then
all-gather); every rank gathers every rank's vector and takes the element-wise MAX itself,
the same result. Every rank must agree the same way: a gather never pairs with a reduce."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

AllGather = Callable[[list[torch.Tensor], torch.Tensor], Any]  # (outputs, input) -> its Work


class GatheredMax:
    """A MAX started by an all_gather: `wait` waits for the gather (at most `timeout`, as a
    Work's), then writes the MAX over the ranks into the tensor given."""

    def __init__(self, t: torch.Tensor, parts: list[torch.Tensor], work: Any) -> None:
        self.t, self.parts, self.work = t, parts, work

    def wait(self, timeout: timedelta | None = None) -> bool:
        """The gather's end, then the MAX in place (a gone peer's error is the Work's)."""
        if timeout is None:
            self.work.wait()
        else:
            self.work.wait(timeout)
        torch.amax(torch.stack(self.parts), dim=0, out=self.t)
        return True


def start_gathered_max(t: torch.Tensor, world_size: int, all_gather: AllGather) -> GatheredMax:
    """The MAX over `world_size` ranks of `t` (1-D), started now through `all_gather`;
    `wait()` on the result writes it into `t`."""
    parts = [torch.empty_like(t) for _ in range(world_size)]
    return GatheredMax(t, parts, all_gather(parts, t))


def start_max_over(pg: Any, t: torch.Tensor) -> GatheredMax:
    """`start_gathered_max` through a process group object of its own (a backend's gloo
    group, a benchmark's rank: not registered with torch.distributed)."""
    return start_gathered_max(t, pg.size(), lambda parts, x: pg.allgather([parts], [x]))
