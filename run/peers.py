"""What a user would run instead of the switch, as `run.train --mode` values: DDP over gloo
with torch's own remedies for communication, each attached to the DDP model in one place.

The plain "gloo" mode already trains NCF with `nn.Embedding(sparse=True)` (run/model.py):
DDP sends the touched rows (gloo's sparse all_reduce: indices and values all-gathered).
- gloo-dense: the same NCF with dense embedding gradients (sparse=False), what a user
  who never turned sparse gradients on runs: DDP all_reduces the whole tables.
- gloo-fp16: `fp16_compress_hook`, half-precision all_reduce (half the bytes).
- gloo-powersgd1 / gloo-powersgd4: PowerSGD of matrix rank 1 / 4 with error feedback and
  warm start; plain all_reduce for the first 10% of the steps, the warm-up PowerSGDState's
  documentation suggests to start tuning from (compressing too early derails training).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

PEERS = ("gloo-dense", "gloo-fp16", "gloo-powersgd1", "gloo-powersgd4")
MODES = ("switch", "gloo", *PEERS)


def prepare(mode: str, model: nn.Module) -> None:
    """Make the embedding gradients dense for every peer mode (before DDP wraps the model:
    DDP decides at construction which parameters expect sparse gradients): gloo-dense is
    that baseline, and torch's compression hooks take dense buckets only. A no-op for the
    switch and plain gloo."""
    if mode not in PEERS:
        return
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if mode == "gloo-dense" and not any(t.sparse for t in tables):
        raise ValueError("gloo-dense needs a model with sparse embedding tables (--model ncf)")
    for table in tables:
        table.sparse = False


def powersgd_start(steps: int) -> int:
    """The warm-up: PowerSGD from step max(2, steps // 10) on (it needs at least 2 when
    error feedback or warm start is on)."""
    return max(2, steps // 10)


def attach(mode: str, model: DistributedDataParallel, steps: int) -> Any:
    """Register the peer's communication hook on the DDP model, if it has one; returns the
    hook state (kept alive by the caller) or None."""
    if mode in ("gloo", "gloo-dense"):
        return None
    if mode == "gloo-fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if mode in ("gloo-powersgd1", "gloo-powersgd4"):
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(mode[-1]),
            start_powerSGD_iter=powersgd_start(steps),
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    raise ValueError(f"unknown peer mode {mode!r}; expected one of {PEERS}")
