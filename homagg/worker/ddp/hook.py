"""A PyTorch DDP communication hook that aggregates each gradient bucket through the switch
with a homomorphic codec, and falls back to the process group's all_reduce, collectively,
when the switch cannot be used (docs/worker.md: the decision protocol and its cost).

    state = SwitchHookState(agent, codec="lossless", asynchronous=True)
    ddp_model.register_comm_hook(state, switch_allreduce_hook)

Blocking (the default) aggregates each bucket inside the hook; asynchronous returns a
pending Future at once and aggregates on the rank's communication thread while backward
goes on; codec="auto" (asynchronous) picks each bucket's path and codec per step
(auto_control), the host all_reduce among them."""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
import logging
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from homagg.worker.auto.control import HOST, AutoConfig, AutoController, Choice, Taken, auto_codecs
from homagg.worker.auto.host_path import AutoHostPath, nonzero_share
from homagg.worker.codecs import (
    AUTO_CODEC,
    DEFAULT_CODEC,
    Codec,
    CodecError,
    GradInput,
    Phase,
    check_codec,
    make_codec,
)
from homagg.worker.ddp import sparse_bucket
from homagg.worker.ddp.comm_thread import CommThread
from homagg.worker.job.agent import WorkerAgent
from homagg.worker.transport.switch_transport import TransportError

log = logging.getLogger(__name__)

Via = Callable[
    [Codec], Generator[Phase, np.ndarray, np.ndarray]
]  # a bucket that drives its codec itself (a sparse bucket: homagg/worker/ddp/sparse_bucket.py)

# close(): how long codec="auto"'s last agreement may take (a gone peer's never finishes)
CLOSE_AGREEMENT_S = 10.0

# Failure kinds, exchanged as MAX over ranks: the highest one names the agreed reason.
OK, UNHEALTHY, CODEC_FAILED, SWITCH_TIMEOUT, ERROR = 0, 1, 2, 3, 4
_KIND_TEXT = {
    UNHEALTHY: "an agent is missing or unhealthy",
    CODEC_FAILED: "a codec error",
    SWITCH_TIMEOUT: "the switch path failed (TransportError)",
    ERROR: "an unexpected error",
}


@dataclass
class HookStats:
    """What the hook did since it was made: buckets per path, agreements, bytes, time."""

    switch_buckets: int = 0
    fallback_buckets: int = 0
    fallbacks: int = 0  # switch -> fallback transitions
    agreements: int = 0  # tiny all_reduces of the decision protocol
    dense_bytes: int = 0  # float32 bytes of the buckets sent through the switch
    wire_bytes: int = 0  # aggregation frames sent for them (retransmissions included)
    wire_cells: int = 0  # the cells those frames carried
    retransmissions: int = 0
    switch_seconds: float = 0.0
    agreement_seconds: float = 0.0
    fallback_reasons: Counter = field(default_factory=Counter)
    host_buckets: int = 0  # buckets codec="auto" sent to the host all_reduce on purpose
    auto_choices: Counter = field(default_factory=Counter)  # codec="auto": bucket-steps per choice
    leased_steps: int = 0  # codec="auto": steps that skipped the agreement (host lease)


class SwitchHookState:
    """The hook's state: the agent (or why there is none), one codec per bucket index, the
    collective decision between switch and fallback, and stats. Picklable (without the
    agent and process group, like PowerSGDState): `attach()` an agent after unpickling."""

    def __init__(
        self,
        agent: WorkerAgent | None,
        codec: str = DEFAULT_CODEC,
        *,
        process_group: dist.ProcessGroup | None = None,
        world_size: int | None = None,
        cooldown_steps: int = 5,
        unavailable_reason: str = "",
        codec_options: dict[str, Any] | None = None,
        asynchronous: bool = False,
        auto: AutoConfig | None = None,
        rank: int | None = None,
        lane_ops: bool = False,
    ) -> None:
        check_codec(codec, also=(AUTO_CODEC,))
        self.agent = agent
        self.unavailable_reason = unavailable_reason or ("" if agent else "no worker agent")
        self.codec_name = codec
        self.codec_options = dict(codec_options or {})
        self.process_group = process_group
        self.world_size = world_size or dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group) if rank is None else rank
        self.cooldown_steps = cooldown_steps
        # codec="auto": codec_options maps a codec name to its options; the low-bit lanes
        # join its codecs when the switch adds them (lane_ops, agreed at the set-up)
        config = auto or AutoConfig(codecs=auto_codecs(lane_ops))
        self.controller = AutoController(config) if codec == AUTO_CODEC else None
        # codec="auto": its host buckets are all-reduced from the hook, as DDP's own
        self.auto_host = AutoHostPath(self.controller) if self.controller is not None else None
        self.asynchronous = asynchronous or self.controller is not None
        self.group = process_group  # collectives of the hook (its own group when asynchronous)
        self.comm: CommThread | None = None
        self._handovers: list[tuple[int, float]] = []  # (bucket, hand-over time) this step
        self._step_start: float | None = None
        self.iteration_seconds = 0.0
        self.codecs: dict[tuple[int, str], tuple[int, Codec]] = {}
        self.stats = HookStats()
        self.warned = False
        self.steps = 0
        self._use_switch: bool | None = None  # None: agree before the next bucket
        self._cooldown_left = 0
        self._fell_back_in_step = -1
        # codec="auto": agreements started and not decided yet (indices, vector, taken, work)
        self._agreeing: deque[tuple[list[int], torch.Tensor, Taken, dist.Work]] = deque()

    def attach(self, agent: WorkerAgent) -> None:
        """Use this agent from the next agreement on (e.g. after unpickling)."""
        self.agent, self.unavailable_reason = agent, ""
        self._use_switch = None

    def __getstate__(self) -> dict[str, Any]:
        state = {
            k: v
            for k, v in self.__dict__.items()
            if k
            not in ("agent", "process_group", "codecs", "group", "comm", "auto_host", "_agreeing")
        }
        if self.process_group is not None:
            log.warning("SwitchHookState pickled without its non-default process group")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.agent, self.process_group, self.codecs = None, None, {}
        self.group, self.comm, self._agreeing = None, None, deque()
        self.auto_host = AutoHostPath(self.controller) if self.controller is not None else None
        self.unavailable_reason = "state was unpickled without its agent"
        self._use_switch = None

    # -- the local view -------------------------------------------------------------

    def local_health(self) -> int:
        """OK when this rank could use the switch now, else UNHEALTHY."""
        a = self.agent
        return OK if a is not None and a.healthy and a.transport is not None else UNHEALTHY

    def local_reason(self) -> str:
        """Why this rank cannot use the switch (empty when it can)."""
        if self.agent is None:
            return self.unavailable_reason
        return "" if self.local_health() == OK else self.agent.unhealthy_reason

    def next_chunk(self) -> int:
        """This rank's transport chunk counter (0 without a transport)."""
        a = self.agent
        return a.transport.next_chunk if a is not None and a.transport is not None else 0

    def codec_for(self, index: int, numel: int) -> Codec:
        """The codec of bucket `index`, re-created when the bucket's size changed (rebuilds).
        With codec="auto" one per bucket and codec name, so a codec's error memory survives
        the steps another codec is used; a ratio change only sets the codec's ratio."""
        name, options = self.codec_name, self.codec_options
        if self.controller is not None:
            choice = self.controller.choice(index)
            name, options = choice.method, {**options.get(choice.method, {}), **choice.options()}
        held = self.codecs.get((index, name))
        if held is None or held[0] != numel:
            held = (numel, make_codec(name, self.world_size, self.rank, **options))
            self.codecs[(index, name)] = held
        elif "ratio" in options:
            held[1].ratio = options["ratio"]  # type: ignore[attr-defined]
        return held[1]

    # -- asynchronous mode -------------------------------------------------------------

    def start_comm(self) -> CommThread:
        """The communication thread and the hook's own process group, made on first use
        (a collective: every rank reaches it at its first bucket). Only that thread issues
        collectives on that group, in bucket order, so no two threads ever interleave
        collectives on one group (the training loop keeps the default group to itself)."""
        if self.comm is None:
            pg = self.process_group
            ranks = None if pg is None else dist.get_process_group_ranks(pg)
            self.group = dist.new_group(ranks=ranks, backend="gloo")
            self.comm = CommThread(f"homagg-comm-{self.rank}")
        return self.comm

    def hand_over(self, index: int, last: bool) -> dict[int, float] | None:
        """Note bucket `index` handed over now (main thread); at the step's last bucket, each
        bucket's budget: the backward compute after its hand-over, plus a tolerated share
        of the iteration time (auto_control's rule; none known in the first step)."""
        now = time.perf_counter()
        if not self._handovers:
            if self._step_start is not None:
                self.iteration_seconds = now - self._step_start
            self._step_start = now
        self._handovers.append((index, now))
        if not last:
            return None
        tol = self.controller.config.tolerance if self.controller is not None else 0.0
        budgets = {i: now - t + tol * self.iteration_seconds for i, t in self._handovers}
        self._handovers = []
        return budgets

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the communication thread has finished every bucket handed over."""
        return True if self.comm is None else self.comm.drain(timeout)

    def close(self) -> None:
        """Stop the communication thread (after its queued buckets) and finish codec="auto"'s
        agreements still in flight (every rank started them; a dead peer's is dropped)."""
        if self.comm is not None:
            self.comm.close()
            self.comm = None
        while self._agreeing:
            try:
                self._agreeing.popleft()[3].wait(timedelta(seconds=CLOSE_AGREEMENT_S))
            except RuntimeError as exc:  # a peer is gone: nothing is left to decide
                log.info("rank %d: an agreement in flight did not finish: %s", self.rank, exc)

    # -- the collective decision ----------------------------------------------------

    def agree(self, failure: int, health: int) -> tuple[int, int, int]:
        """MAX over ranks of (failure kind, health kind, next chunk): one tiny all_reduce."""
        start = time.perf_counter()
        t = torch.tensor([failure, health, self.next_chunk()], dtype=torch.int64)
        self.reduce_max(t)
        self.stats.agreements += 1
        self.stats.agreement_seconds += time.perf_counter() - start
        f, h, c = (int(v) for v in t.tolist())
        return f, h, c

    def reduce_max(self, t: torch.Tensor) -> None:
        """MAX over ranks in place, through the hook's group (a backend overrides it)."""
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)

    def reduce_max_async(self, t: torch.Tensor) -> dist.Work:
        """MAX over ranks in place, started now through the hook's group (codec="auto"'s
        agreement: issued from the communication thread only, so in one order everywhere)."""
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        assert work is not None
        return work

    def host_all_reduce(self, buf: torch.Tensor) -> None:
        """The host path's SUM over ranks in place, through the hook's group."""
        dist.all_reduce(buf, group=self.group)

    def host_all_reduce_async(self, buf: torch.Tensor) -> dist.Work:
        """The host path's SUM over ranks in place, started now through DDP's own process
        group (codec="auto"'s host buckets, from the hook, as DDP without a hook does)."""
        work = dist.all_reduce(buf, group=self.process_group, async_op=True)
        assert work is not None
        return work

    def _realign(self, chunk: int) -> None:
        # Every rank resumes at the largest counter any rank reached: each new chunk is newer
        # than whatever a failed round left in the slots, so the switch starts it FRESH.
        if self.agent is not None and self.agent.transport is not None:
            self.agent.transport.next_chunk = chunk

    def fall_back(self, kind: int, local_reason: str, chunk: int) -> None:
        """Switch -> fallback for `cooldown_steps` steps; warn once, count, realign chunks."""
        reason = _KIND_TEXT.get(kind, "unknown")
        if local_reason:
            reason += f" ({local_reason})"
        self.stats.fallbacks += 1
        self.stats.fallback_reasons[_KIND_TEXT.get(kind, "unknown")] += 1
        self._use_switch = False
        self._cooldown_left = self.cooldown_steps
        self._fell_back_in_step = self.steps
        self._realign(chunk)
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"homagg: rank {self.rank} falls back to the process group's all_reduce: "
                f"{reason}; retrying the switch every {self.cooldown_steps} step(s)",
                RuntimeWarning,
                stacklevel=3,
            )
        log.info("rank %d: fallback (%s)", self.rank, reason)

    def use_switch(self) -> bool:
        """The agreed path for the next bucket (agreeing first when it is not known)."""
        if self._use_switch is None:
            _, health, chunk = self.agree(OK, self.local_health())
            if health == OK:
                self._use_switch = True
                self._realign(chunk)
            else:
                self.fall_back(health, self.local_reason(), chunk)
        return bool(self._use_switch)

    def end_step(self, budgets: dict[int, float] | None = None) -> None:
        """After a step's last bucket: count down the cool-down (whole steps after the one
        that fell back), then agree again; codec="auto" decides the next step's paths (a
        job of its own on the communication thread, after the last bucket's Future is
        complete: its agreement is not in the step's critical path)."""
        try:
            if self._use_switch is False:
                if self._fell_back_in_step != self.steps:
                    self._cooldown_left -= 1
                if self._cooldown_left <= 0:
                    self._use_switch = None
            if self.auto_host is not None:
                self.auto_host.record()
            if self.controller is not None and budgets:
                if self.controller.lease > 0:  # settled on the host path: no all_reduce
                    self.controller.skip()
                    self.stats.leased_steps += 1
                else:
                    self.auto_decide(budgets)
            self.steps += 1
        finally:
            if self.auto_host is not None:
                self.auto_host.decided.set()  # the next step's choices may be read

    def auto_decide(self, budgets: dict[int, float]) -> dict[int, str]:
        """Start one MAX all_reduce of this step's [-costs, -budgets, nonzero shares, wire
        densities, the step before's iteration time]; the controller decides from the one
        started `lag` steps ago (lag 1: done while this step ran, so nothing waits for
        the network here), the same on every rank. Empty while none is old enough."""
        ctl = self.controller
        assert ctl is not None
        indices = sorted(budgets)
        t = torch.from_numpy(ctl.measurements(indices, budgets, self.iteration_seconds))
        self._agreeing.append((indices, t, ctl.taken(), self.reduce_max_async(t)))
        if len(self._agreeing) <= ctl.config.lag:
            return {}
        indices, t, taken, work = self._agreeing.popleft()
        start = time.perf_counter()
        work.wait()
        self.stats.agreements += 1
        self.stats.agreement_seconds += time.perf_counter() - start
        return ctl.decide(indices, t.numpy(), taken)


def _through_switch(
    state: SwitchHookState,
    index: int,
    grad: GradInput | None,
    length: int,
    phases: Generator[Phase, np.ndarray, np.ndarray] | None = None,
    via: Via | None = None,
) -> tuple[np.ndarray | None, int, str]:
    """(decoded sum, OK, "") or (None, failure kind, reason) for one bucket on this rank;
    `phases` replace the bucket codec's (a raw switch operation); `via` drives the bucket's
    codec instead of its `aggregate(grad)`."""
    agent = state.agent
    if agent is None or agent.transport is None or not agent.healthy:
        return None, UNHEALTHY, state.local_reason()
    transport = agent.transport
    before = (transport.stats.packets_sent, transport.stats.retransmissions)
    start = time.perf_counter()
    try:
        if phases is None:
            codec = state.codec_for(index, length)
            phases = via(codec) if via is not None else codec.aggregate(_given(grad))
        out = transport.run(phases)
    except TransportError as exc:
        return None, SWITCH_TIMEOUT, str(exc)
    except CodecError as exc:
        return None, CODEC_FAILED, f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        log.exception("rank %d: switch aggregation failed", state.rank)
        return None, ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        state.stats.switch_seconds += time.perf_counter() - start
        packets = transport.stats.packets_sent - before[0]
        state.stats.wire_bytes += packets * transport.config.frame_bytes
        state.stats.wire_cells += packets * transport.config.cells_per_packet
        state.stats.retransmissions += transport.stats.retransmissions - before[1]
    return out, OK, ""


def _given(grad: GradInput | None) -> GradInput:
    assert grad is not None, "a bucket's gradient, phases or via"
    return grad


def _into_bucket(buf: torch.Tensor, out: np.ndarray) -> torch.Tensor:
    """The decoded sum written into the bucket's own buffer (codecs may return a buffer
    they reuse, so nothing may keep referring to it)."""
    if buf.device.type == "cpu" and buf.dtype == torch.float32 and buf.is_contiguous():
        np.copyto(buf.detach().numpy().reshape(-1), out.reshape(-1))
    else:
        buf.copy_(torch.from_numpy(np.array(out, np.float32)).reshape(buf.shape))
    return buf


def _completed(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def aggregate_bucket(state: SwitchHookState, index: int, buf: torch.Tensor) -> torch.Tensor:
    """Bucket `index` summed (through the switch, or agreed by every rank by the hook
    group's all_reduce) and divided by the world size, in place, before returning: the
    communication thread's job (and DeAR's). codec="auto": the controller's path, timed."""
    start, sent = time.perf_counter(), state.stats.wire_cells
    choice = state.controller.choice(index) if state.controller is not None else None
    result: torch.Tensor | None = None
    ran: Choice | None = choice
    if choice is not None and choice.method == HOST:
        state.host_all_reduce(buf)
        state.stats.host_buckets += 1
        result = buf
    elif state.use_switch():
        result = _switch_or_none(state, index, buf)
    if result is None:
        ran = None  # the agreed fallback: not a measurement of the chosen path
        state.stats.fallback_buckets += 1
        state.host_all_reduce(buf)
        result = buf
    if state.controller is not None and choice is not None:
        nonzero = nonzero_share(buf) if not state.controller.known(index) else 1.0
        wire = (state.stats.wire_cells - sent) / max(1, buf.numel())  # per dense cell
        state.controller.record(index, time.perf_counter() - start, ran, nonzero, wire)
        state.stats.auto_choices[choice.label] += 1
    return result.div_(state.world_size)


def _switch_or_none(state: SwitchHookState, index: int, buf: torch.Tensor) -> torch.Tensor | None:
    """The bucket summed by the switch into `buf`, or None when the ranks agreed to fall
    back (the agreement all_reduce is issued on every rank either way)."""
    if buf.is_sparse:  # a sparse parameter's bucket: its rows, never densified
        sparse = sparse_bucket.SparseBucket(buf)
        summed = agreed_sum(state, index, None, buf.numel(), via=sparse.phases)
        return None if summed is None else sparse.result(summed)
    grad = buf.detach().reshape(-1).to("cpu", torch.float32).numpy()
    out = agreed_sum(state, index, grad, grad.size)
    return None if out is None else _into_bucket(buf, out)


def agreed_sum(
    state: SwitchHookState,
    index: int,
    grad: GradInput | None,
    length: int,
    phases: Generator[Phase, np.ndarray, np.ndarray] | None = None,
    via: Via | None = None,
) -> np.ndarray | None:
    """The switch's sum of `grad` (by bucket `index`'s codec, or by `phases`, or by what
    `via` makes of the codec) when every rank's succeeded, else None after the agreed
    fall-back; one agreement either way."""
    out, failure, reason = _through_switch(state, index, grad, length, phases, via)
    failed, health, chunk = state.agree(failure, state.local_health())
    if failed != OK:
        state.fall_back(failed, reason, chunk)
        return None
    assert out is not None
    state.stats.switch_buckets += 1
    state.stats.dense_bytes += length * 4
    if health != OK:  # this result is good; the next bucket takes the fallback
        state.fall_back(health, state.local_reason(), chunk)
    return out


def _issue(
    state: SwitchHookState, comm: CommThread, index: int, buf: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """Asynchronous mode: bucket `index` queued for the communication thread, or, when
    codec="auto" sends it to the host this step, all-reduced from here as DDP's own."""
    host = state.auto_host
    if host is not None and host.is_host(index):
        state.stats.host_buckets += 1
        state.stats.auto_choices[HOST] += 1
        return host.issue(index, buf, state.host_all_reduce_async, state.world_size)
    return comm.submit(lambda: aggregate_bucket(state, index, buf))


def switch_allreduce_hook(
    state: SwitchHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients summed through the switch (or, agreed by every
    rank, by the process group's all_reduce) and divided by the world size. Asynchronous:
    a pending Future at once, completed by the rank's communication thread."""
    buf = bucket.buffer()
    if state.asynchronous:
        comm = state.start_comm()
        index, last = bucket.index(), bucket.is_last()
        budgets = state.hand_over(index, last)
        fut = _issue(state, comm, index, buf)
        if last:  # after the last bucket's Future completes, on the same thread
            if state.auto_host is not None:
                state.auto_host.deciding()
            comm.submit(lambda: state.end_step(budgets))
        return fut
    result = _switch_or_none(state, bucket.index(), buf) if state.use_switch() else None
    if bucket.is_last():
        state.end_step()
    if result is not None:
        return _completed(result.div_(state.world_size))
    state.stats.fallback_buckets += 1
    work = dist.all_reduce(buf, group=state.process_group, async_op=True)
    world_size = state.world_size
    return work.get_future().then(lambda fut: fut.value()[0].div_(world_size))
