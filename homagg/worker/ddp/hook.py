"""A PyTorch DDP communication hook that aggregates each gradient bucket through the switch
with a homomorphic codec, and falls back to the process group's all_reduce, collectively,
when the switch cannot be used (docs/worker.md: the decision protocol and its cost).

    state = SwitchHookState(agent, codec="lossless", asynchronous=True)
    ddp_model.register_comm_hook(state, switch_allreduce_hook)

In PyTorch's style (torch.distributed.algorithms.ddp_comm_hooks): a picklable state and
pure hook functions. The state composes the fallback agreement (fallback.py), the codecs
(codec_cache.py) and the stats (stats.py); `blocking_hook` aggregates each bucket inside
the hook, `asynchronous_hook` (async_hook.py) returns a pending Future at once and
aggregates on the rank's communication thread while backward goes on; codec="auto"
(asynchronous) picks each bucket's path and codec per step (auto/control.py), the host
all_reduce among them. `switch_allreduce_hook` runs the one the state asks for."""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
import contextlib
import logging
import time
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from homagg.worker.auto.control import AutoConfig, AutoController, auto_codecs
from homagg.worker.auto.host_path import AutoHostPath
from homagg.worker.auto.measurements import to_cells
from homagg.worker.codecs import AUTO_CODEC, DEFAULT_CODEC, Codec, check_codec
from homagg.worker.ddp import fallback
from homagg.worker.ddp.agreement import SwitchDecision
from homagg.worker.ddp.async_hook import asynchronous_hook
from homagg.worker.ddp.auto_agreement import PendingDecision, start_decision
from homagg.worker.ddp.blocking_hook import COALESCE_CELLS, HeldBucket, blocking_hook
from homagg.worker.ddp.codec_cache import CodecCache
from homagg.worker.ddp.comm_thread import CommThread
from homagg.worker.ddp.fallback import FallbackAgreement
from homagg.worker.ddp.gathered_max import GatheredMax, start_gathered_max
from homagg.worker.ddp.stats import HookStats
from homagg.worker.ddp.switch_path import seal_step
from homagg.worker.job.agent import WorkerAgent

log = logging.getLogger(__name__)

# close(): how long the last seal or codec="auto"'s last agreement may take (a gone peer's
# never finishes)
CLOSE_AGREEMENT_S = 10.0

# Not pickled: the live objects (an unpickled state is given an agent with `attach`).
_UNPICKLED = (
    "agent",
    "process_group",
    "group",
    "comm",
    "auto_host",
    "_agreeing",
    "metrics",
    "unsealed_decision",
    "held",
)


class SwitchHookState:
    """The hook's state: the agent (or why there is none), the codecs, the collective
    fallback agreement, the communication thread and codec="auto"'s controller, and stats.
    Picklable (without the agent and process group, like PowerSGDState): `attach()` an
    agent after unpickling."""

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
        switch_agreements: bool = True,
        switch_decisions: bool = True,
        coalesce_cells: int = COALESCE_CELLS,
    ) -> None:
        check_codec(codec, also=(AUTO_CODEC,))
        self.agent = agent
        self.unavailable_reason = unavailable_reason or ("" if agent else "no worker agent")
        self.codec_name = codec
        self.codec_options = dict(codec_options or {})
        self.process_group = process_group
        self.world_size = world_size or dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group) if rank is None else rank
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
        self.codecs = CodecCache(self.world_size, self.rank)
        self.stats = HookStats()
        self.metrics: Any = None  # its WorkerMetrics endpoint, when served (ddp/metrics.py)
        self.fallback = FallbackAgreement(cooldown_steps)
        # buckets within a step agreed by a verdict packet through the switch (agreement.py)
        self.switch_agreements = switch_agreements
        # codec="auto": its decision vector through the switch too (auto_agreement.py)
        self.switch_decisions = switch_decisions
        self.warned = False
        self.steps = 0
        # codec="auto": decisions started and not read yet (auto_agreement.py), and the one
        # through the switch since the last agreement over the process group
        self._agreeing: deque[PendingDecision] = deque()
        self.unsealed_decision: SwitchDecision | None = None
        self._released = False  # this step's end let the next step's choices be read
        # the blocking hook: buckets held for one switch round with later ones, up to this
        # many dense cells a round (blocking_hook.py; 0: every bucket alone)
        self.coalesce_cells = coalesce_cells
        self.held: list[HeldBucket] = []

    def attach(self, agent: WorkerAgent) -> None:
        """Use this agent from the next agreement on (e.g. after unpickling)."""
        self.agent, self.unavailable_reason = agent, ""
        self.fallback.use = None

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in _UNPICKLED}
        if self.process_group is not None:
            log.warning("SwitchHookState pickled without its non-default process group")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.agent, self.process_group = None, None
        self.group, self.comm, self._agreeing, self.metrics = None, None, deque(), None
        self.unsealed_decision, self.held = None, []
        self.auto_host = AutoHostPath(self.controller) if self.controller is not None else None
        self.unavailable_reason = "state was unpickled without its agent"
        self.fallback.use = None

    # -- the local view -------------------------------------------------------------

    def local_reason(self) -> str:
        """Why this rank cannot use the switch (empty when it can)."""
        return fallback.local_reason(self)

    def codec_for(self, index: int, numel: int) -> Codec:
        """The codec of bucket `index`, re-created when the bucket's size changed (rebuilds).
        With codec="auto" one per bucket and codec name, so a codec's error memory survives
        the steps another codec is used; a ratio change only sets the codec's ratio."""
        name, options = self.codec_name, self.codec_options
        if self.controller is not None:
            choice = self.controller.choice(index)
            name, options = choice.method, {**options.get(choice.method, {}), **choice.options()}
        return self.codecs.get(index, numel, name, options)

    def use_switch(self) -> bool:
        """The agreed path for the next bucket (agreeing first when it is not known)."""
        return self.fallback.use_switch(self)

    @property
    def seal_later(self) -> bool:
        """Whether the step's seal is started at its end and read before the next bucket
        (its last bucket then agreed by a verdict packet): not where codec="auto"'s
        decision rides on it, whose repair must come before anything else is issued."""
        return self.controller is None

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
        of the iteration time (auto/control.py's rule; none known in the first step)."""
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
        """Stop the communication thread (after its queued buckets and the last decision's
        seal), read the last step's seal and finish codec="auto"'s agreements still in
        flight (every rank started them; a dead peer's is dropped)."""
        if self.comm is not None:
            with contextlib.suppress(RuntimeError):  # closed already: nothing more to queue
                self.comm.submit(self.seal_last_decision)
            self.comm.close()
            self.comm = None
        try:  # the last step's seal: a rank that missed a switch answer is waiting on it
            self.fallback.settle(self, CLOSE_AGREEMENT_S)
        except RuntimeError as exc:
            log.info("rank %d: the last step's seal did not finish: %s", self.rank, exc)
        while self._agreeing:
            try:
                self._agreeing.popleft().finish(CLOSE_AGREEMENT_S)
            except RuntimeError as exc:  # a peer is gone: nothing is left to decide
                log.info("rank %d: an agreement in flight did not finish: %s", self.rank, exc)

    def seal_last_decision(self) -> None:
        """codec="auto": seal the last step's decision through the switch over the process
        group, as the next step's end would have (a rank that missed its answer waits there
        for the others). Every rank sent it or none did, so every rank agrees here or is in
        that agreement already (it missed the answer: nothing unsealed left). Run on the
        communication thread, as every collective of the hook's group."""
        if self.controller is not None:
            seal_step(self)

    # -- collectives (a backend or a test overrides them) -----------------------------

    def reduce_max(self, t: torch.Tensor) -> None:
        """MAX over ranks in place, through the hook's group (a backend overrides it)."""
        self.reduce_max_async(t).wait()

    def reduce_max_async(self, t: torch.Tensor) -> GatheredMax:
        """MAX over ranks in place, started now through the hook's group by one all_gather
        (gathered_max.py: half the hops of gloo's all_reduce); `wait()` writes it. Issued
        in one order everywhere (the hook's thread, or the communication thread)."""

        def gather(parts: list[torch.Tensor], x: torch.Tensor) -> dist.Work:
            work = dist.all_gather(parts, x, group=self.group, async_op=True)
            assert work is not None
            return work

        return start_gathered_max(t, dist.get_world_size(self.group), gather)

    def host_all_reduce(self, buf: torch.Tensor) -> None:
        """The host path's SUM over ranks in place, through the hook's group."""
        dist.all_reduce(buf, group=self.group)

    def host_all_reduce_async(self, buf: torch.Tensor) -> dist.Work:
        """The host path's SUM over ranks in place, started now through DDP's own process
        group (codec="auto"'s host buckets, from the hook, as DDP without a hook does)."""
        work = dist.all_reduce(buf, group=self.process_group, async_op=True)
        assert work is not None
        return work

    # -- the step's end ----------------------------------------------------------------

    def end_step(self, budgets: dict[int, float] | None = None) -> None:
        """After a step's last bucket: count down the cool-down (whole steps after the one
        that fell back), then agree again; codec="auto" decides the next step's paths (a
        job of its own on the communication thread, after the last bucket's Future is
        complete: its agreement is not in the step's critical path)."""
        self._released = False
        try:
            seal_step(self)
            self.fallback.count_down(self.steps)
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
            if self.auto_host is not None and not self._released:
                self.auto_host.decided.set()  # the next step's choices may be read

    def auto_decide(self, budgets: dict[int, float]) -> dict[int, str]:
        """Agree this step's measurements (auto/measurements.py) by MAX: one packet
        through the switch, or one all_reduce started on the hook's group
        (auto_agreement.py); the controller decides from the ones agreed `lag` steps ago
        (lag 1: done while this step ran, so nothing waits for the network here), the same
        on every rank. With lag 1 that decision comes first: the next step's choices say
        which way this step's cells go, and the next step starts while they are on the
        way (its host buckets issued from the hook). Empty while none is old enough."""
        ctl = self.controller
        assert ctl is not None
        indices = sorted(budgets)
        cells = to_cells(ctl.measurements(indices, budgets, self.iteration_seconds))
        taken = ctl.taken()
        out: dict[int, str] = {}
        if ctl.config.lag:
            if len(self._agreeing) >= ctl.config.lag:
                out = self._decide_oldest()
            if self.auto_host is not None:  # the next step may start: its choices are final
                # (once only: that step's own end may clear it before this one is over)
                self._released = True
                self.auto_host.decided.set()
        self._agreeing.append(start_decision(self, indices, cells, taken))
        if not ctl.config.lag:
            out = self._decide_oldest()
        return out

    def _decide_oldest(self) -> dict[int, str]:
        """The controller's decision from the oldest agreement in flight."""
        assert self.controller is not None
        pending = self._agreeing.popleft()
        start = time.perf_counter()
        vector = pending.vector()
        if pending.work is not None:
            self.stats.agreed(start)
        return self.controller.decide(pending.indices, vector, pending.taken)


def switch_allreduce_hook(
    state: SwitchHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients summed through the switch (or, agreed by every
    rank, by the process group's all_reduce) and divided by the world size; the state's
    `asynchronous` picks `asynchronous_hook` (a pending Future at once) or `blocking_hook`."""
    if state.asynchronous:
        return asynchronous_hook(state, bucket)
    return blocking_hook(state, bucket)
