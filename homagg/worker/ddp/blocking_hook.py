"""The blocking DDP hook: a step's buckets summed through the switch inside the hook. Small
buckets are held (their Futures pending) and sent with the ones after them in one switch
round, their codecs' phases coalesced (codecs/coalesce.py), until the round would pass
`coalesce_cells` dense cells or the step's last bucket comes: a step of small buckets (NCF's
two sparse tables and its dense rest) pays one bucket's round trips and one verdict. The
hook blocks backward either way, so holding a bucket delays nothing that could overlap it.
Every rank holds and sends the same buckets (their sizes and order are the same)."""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from homagg.worker.ddp.switch_path import switch_sums

if TYPE_CHECKING:
    from homagg.worker.ddp.hook import SwitchHookState

# A round holds buckets of at most this many dense cells together (4 MiB of float32): DDP's
# first bucket (1 MiB) and buckets of small models ride one round; fusing big buckets would
# only copy their cells into one array, for a round trip that is small beside their packets.
COALESCE_CELLS = 1 << 20


@dataclass
class HeldBucket:
    """A bucket handed over and not sent yet: its index, buffer and the pending Future DDP
    was given."""

    index: int
    buf: torch.Tensor
    fut: torch.futures.Future

    @property
    def cells(self) -> int:
        """Its dense cells (a sparse bucket's: its table's)."""
        return self.buf.numel()


def blocking_hook(
    state: "SwitchHookState", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients summed through the switch inside the hook (or,
    agreed by every rank, by the process group's all_reduce) and divided by the world size;
    a small bucket's Future completes with the round of a later bucket of the same step."""
    held = HeldBucket(bucket.index(), bucket.buffer(), torch.futures.Future())
    last = bucket.is_last()
    if state.held and sum(h.cells for h in state.held) + held.cells > state.coalesce_cells:
        _send_held(state, last=False)
    state.held.append(held)
    # agreed to fall back (the same on every rank; nothing is held then): each bucket's
    # all_reduce starts at once and overlaps the rest of backward, as DDP's own does
    falling_back = state.fallback.use is False
    if last or falling_back or sum(h.cells for h in state.held) >= state.coalesce_cells:
        _send_held(state, last)
    if last:
        state.end_step()
    return held.fut


def _send_held(state: "SwitchHookState", last: bool) -> None:
    """The held buckets in one switch round, their Futures completed; or, agreed by every
    rank, each all-reduced by the process group (`last`: the round holds the step's last)."""
    held, state.held = state.held, []
    try:
        sums = (
            switch_sums(state, [(h.index, h.buf) for h in held], last)
            if state.use_switch()
            else None
        )
    except BaseException as exc:  # DDP's waits on the held Futures must not hang
        for h in held:
            h.fut.set_exception(exc)
        raise
    if sums is not None:
        for h, summed in zip(held, sums):
            h.fut.set_result(summed.div_(state.world_size))
        return
    for h in held:
        state.stats.fallback_buckets += 1
        work = dist.all_reduce(h.buf, group=state.process_group, async_op=True)
        _complete(h.fut, work.get_future(), state.world_size)


def _complete(fut: torch.futures.Future, work: torch.futures.Future, world_size: int) -> None:
    """`fut` completed with `work`'s all-reduced tensor divided by the world size, or with
    its error (a waiter must never hang on it)."""

    def done(w: torch.futures.Future) -> None:
        try:
            fut.set_result(w.value()[0].div_(world_size))
        except Exception as exc:
            fut.set_exception(exc)

    work.add_done_callback(done)
