"""DeAR-style data parallelism (papers.md section 7): each gradient bucket is handed to the
rank's communication thread as soon as backward has produced it, and the wait for its sum,
with the optimizer update of its parameters, happens in the forward pre-hook of the first
module that uses them in the next iteration, so aggregation overlaps the rest of backward
and the next forward. DDP, by contrast, waits for every bucket at the end of backward.

    dear = DearDataParallel(model, torch.optim.SGD(model.parameters(), lr=0.1), state)
    for x, y in data:
        loss_fn(dear(x), y).backward()     # no optimizer.step(): DeAR steps each bucket
    dear.flush()                           # the last iteration's updates

Buckets follow the order in which the first forward used the parameters (reversed, as
backward produces them); their size is tuned on the first iterations (BucketTuner)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from homagg.worker.ddp.bucket_tuner import BucketTuner
from homagg.worker.ddp.comm_thread import CommThread
from homagg.worker.ddp.hook import SwitchHookState
from homagg.worker.ddp.switch_path import aggregate_bucket

log = logging.getLogger(__name__)

Aggregate = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass
class Bucket:
    """Parameters whose gradients travel together, their flat buffer and its pending sum."""

    index: int
    params: list[nn.Parameter]
    flat: torch.Tensor
    optimizer: torch.optim.Optimizer
    groups: list[int]  # the user's param group of each of `optimizer`'s groups
    ready: int = 0  # parameters whose gradient this backward has produced
    future: torch.futures.Future | None = None
    offsets: list[int] = field(default_factory=list)


class HostAggregate:
    """The process group's all_reduce (gloo) on the DeAR's own group, averaged."""

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        self.group = dist.new_group(ranks=ranks, backend="gloo")
        self.world_size = dist.get_world_size(self.group)
        self.comm = CommThread(f"homagg-comm-{dist.get_rank()}")

    def __call__(self, index: int, buf: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, divided by the world size, in place."""
        dist.all_reduce(buf, group=self.group)
        return buf.div_(self.world_size)

    def hand_over(self, index: int, last: bool) -> None:
        """Nothing to budget."""

    def end_step(self, budgets: dict[int, float] | None = None) -> None:
        """Nothing to decide after a step."""

    def close(self) -> None:
        """Stop the communication thread after its queued buckets."""
        self.comm.close()


class SwitchAggregate:
    """The switch hook's path (codec, collective fallback) for DeAR's buckets."""

    def __init__(self, state: SwitchHookState) -> None:
        self.state = state
        self.comm = state.start_comm()
        self.group = state.group

    def __call__(self, index: int, buf: torch.Tensor) -> torch.Tensor:
        """Bucket `index` averaged through the switch (or the agreed fallback)."""
        return aggregate_bucket(self.state, index, buf)

    def hand_over(self, index: int, last: bool) -> dict[int, float] | None:
        """Bucket `index` handed over now (codec="auto": its budget, at the last bucket)."""
        return self.state.hand_over(index, last) if self.state.controller is not None else None

    def end_step(self, budgets: dict[int, float] | None = None) -> None:
        """After the step's last bucket: the hook state's cool-down count; codec="auto"
        decides the next step's paths."""
        self.state.end_step(budgets)

    def close(self) -> None:
        """The hook state's close(): the communication thread stops after its queued
        buckets and codec="auto"'s last decision's seal."""
        self.state.close()


class DearDataParallel(nn.Module):
    """`module` trained data-parallel with DeAR's overlap; steps `optimizer` itself, one
    bucket at a time (any torch.optim optimizer: per-bucket copies of its param groups,
    hyperparameters re-read from it before each update, so LR schedulers keep working)."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: SwitchHookState | None = None,
        *,
        bucket_bytes: int | None = None,
        candidates: Sequence[int] = (256 << 10, 1 << 20, 4 << 20, 16 << 20),
        tune_steps: int = 3,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.module, self.optimizer = module, optimizer
        for p in module.parameters():  # every rank starts from rank 0's parameters
            dist.broadcast(p.data, src=0, group=process_group)
        self.agg: HostAggregate | SwitchAggregate = (
            SwitchAggregate(state) if state is not None else HostAggregate(process_group)
        )
        params = [p for p in module.parameters() if p.requires_grad]
        total = sum(p.numel() * p.element_size() for p in params)
        self.tuner = BucketTuner(
            [bucket_bytes] if bucket_bytes else list(candidates), total, tune_steps
        )
        self.bucket_bytes = self.tuner.current
        self.auto = state.controller if state is not None else None  # codec="auto"
        if self.auto is not None and self.tuner.chosen is None:
            self.auto.hold()  # the sizes are compared on the exact codec; auto starts after
        self.buckets: list[Bucket] = []
        self._order: list[nn.Parameter] = []  # in the order of their owners' first forward
        self._ran: list[nn.Module] = []  # modules whose forward ran, first iteration, in order
        self._owner: dict[nn.Module, list[nn.Parameter]] = {}
        self._bucket_of: dict[nn.Parameter, Bucket] = {}
        self._next_submit = 0
        self._callback_queued = False
        self._handles: list[Any] = []
        for p in params:
            self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        for m in module.modules():
            if any(p.requires_grad for p in m.parameters()):
                self._handles.append(m.register_forward_pre_hook(self._pre_forward))

    # -- forward ---------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward; first iteration: learn the order of use; while tuning:
        measure, and switch bucket sizes at iteration boundaries."""
        tuning = self.tuner.chosen is None
        new_size = self.tuner.on_iteration(time.perf_counter(), self._agree_times)
        if tuning and self.tuner.chosen is not None and self.auto is not None:
            self.agg.comm.submit(self.auto.release)  # after the last step's jobs
        if new_size is not None and self.buckets:
            self.flush()
            self.bucket_bytes = new_size
            self._build_buckets()
        out = self.module(*args, **kwargs)
        if not self.buckets:
            self._assign_owners()
            self._build_buckets()
        self.flush()  # buckets of parameters this forward did not use
        return out

    def _pre_forward(self, module: nn.Module, _inputs: Any) -> None:
        if not self.buckets:
            if module not in self._ran:
                self._ran.append(module)
            return
        for p in self._owner.get(module, ()):
            self._finish(self._bucket_of[p])

    def _assign_owners(self) -> None:
        """Each parameter to the innermost module holding it whose forward ran in the first
        iteration: a module may use a child's parameters without calling the child (as
        nn.MultiheadAttention does with out_proj), so the child's pre-hook never comes and
        the update must happen before the parent runs. A shared parameter goes to the
        module that ran first."""
        when = {m: i for i, m in enumerate(self._ran)}
        owner: dict[nn.Parameter, nn.Module] = {}

        def visit(m: nn.Module, nearest: nn.Module) -> None:
            here = m if m in when else nearest
            for p in m.parameters(recurse=False):
                if not p.requires_grad:
                    continue
                if p not in owner or when.get(here, -1) < when.get(owner[p], -1):
                    owner[p] = here
            for child in m.children():
                visit(child, here)

        visit(self.module, self.module)
        self._owner = {}
        for p, m in owner.items():
            self._owner.setdefault(m, []).append(p)
        ranked = sorted(self._owner, key=lambda m: when.get(m, -1))
        self._order = [p for m in ranked for p in self._owner[m]]

    # -- buckets ---------------------------------------------------------------------

    def _build_buckets(self) -> None:
        """Buckets of about `bucket_bytes` in reverse order of first use (backward's order)."""
        groups: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed(self._order):
            if groups[-1] and size + p.numel() * p.element_size() > self.bucket_bytes:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += p.numel() * p.element_size()
        self.buckets = [self._make_bucket(i, ps) for i, ps in enumerate(groups)]
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        self._next_submit = 0
        log.info("DeAR: %d buckets of <= %d bytes", len(self.buckets), self.bucket_bytes)

    def _make_bucket(self, index: int, params: list[nn.Parameter]) -> Bucket:
        members = set(params)
        groups, which = [], []
        for gi, g in enumerate(self.optimizer.param_groups):
            mine = [p for p in g["params"] if p in members]
            if mine:
                groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": mine})
                which.append(gi)
        opt = type(self.optimizer)(groups, **self.optimizer.defaults)
        for p in params:  # state already held (e.g. a loaded checkpoint) carries over
            if p in self.optimizer.state:
                opt.state[p] = self.optimizer.state[p]
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        flat = torch.zeros(offsets[-1], dtype=params[0].dtype)
        return Bucket(index, params, flat, opt, which, offsets=offsets)

    # -- backward: hand buckets over, in index order on every rank ----------------------

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self.buckets:
            return  # cannot happen after a forward; a stray backward is left alone
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        b = self._bucket_of[p]  # type: ignore[index]
        b.ready += 1
        self._submit_ready()

    def _submit_ready(self) -> None:
        while self._next_submit < len(self.buckets):
            b = self.buckets[self._next_submit]
            if b.ready < len(b.params):
                return
            self._submit(b)

    def _end_backward(self) -> None:
        """Buckets with parameters that got no gradient go too (zeros), in order."""
        self._callback_queued = False
        while self._next_submit < len(self.buckets):
            self._submit(self.buckets[self._next_submit])
        self._next_submit = 0

    def _submit(self, b: Bucket) -> None:
        for p, lo, hi in zip(b.params, b.offsets, b.offsets[1:]):
            if p.grad is None:
                b.flat[lo:hi].zero_()
            elif p.grad.is_sparse:  # nn.Embedding(sparse=True): its rows, into the bucket
                b.flat[lo:hi].copy_(p.grad.detach().to_dense().reshape(-1))
            else:
                b.flat[lo:hi].copy_(p.grad.detach().reshape(-1))
        last = b.index == len(self.buckets) - 1
        flat, agg, index = b.flat, self.agg, b.index
        budgets = agg.hand_over(index, last)
        b.future = agg.comm.submit(lambda: agg(index, flat))
        if last:  # after the last bucket, on the same thread
            agg.comm.submit(lambda: agg.end_step(budgets))
        b.ready = 0
        self._next_submit += 1

    # -- the next forward: wait, then update ------------------------------------------

    def _finish(self, b: Bucket) -> None:
        """Wait for bucket b's sum and apply the optimizer to its parameters (once)."""
        if b.future is None:
            return
        fut, b.future = b.future, None
        avg = fut.wait()
        for p, lo, hi in zip(b.params, b.offsets, b.offsets[1:]):
            p.grad = avg[lo:hi].view_as(p).clone()
        for mine, gi in zip(b.optimizer.param_groups, b.groups):
            for k, v in self.optimizer.param_groups[gi].items():
                if k != "params":
                    mine[k] = v
        b.optimizer.step()
        for p in b.params:
            p.grad = None
            if p in b.optimizer.state:  # the user's optimizer holds the same state objects
                self.optimizer.state[p] = b.optimizer.state[p]  # (checkpoints, rebuilds)

    def flush(self) -> None:
        """Wait for every handed-over bucket and apply its update (after the last
        iteration, before reading or saving the parameters)."""
        for b in self.buckets:
            self._finish(b)

    def _agree_times(self, times: list[float]) -> list[float]:
        """MAX over ranks of the tuner's measured times, on the communication thread (the
        only thread that issues collectives on its group)."""
        t = torch.tensor(times, dtype=torch.float64)
        group = self.agg.group
        self.agg.comm.submit(lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)).wait()
        return [float(v) for v in t]

    def close(self) -> None:
        """Flush, remove the hooks and stop the communication thread."""
        self.flush()
        for h in self._handles:
            h.remove()
        self.agg.close()
