"""The collective fallback agreement: for every bucket all ranks take the same path, the
switch or the process group's all_reduce (docs/worker.md: the decision protocol and its
cost). A bucket is agreed by one MAX packet through the switch (agreement.py); the step's
seal, and each agreement after a failure, by one tiny MAX of a `GlooVerdict` (gathered_max.py).
The seal is started at the step's end and read before the next bucket's path is chosen
(`PendingSeal`), so the step's last bucket does not wait on the process group; where
codec="auto"'s decision rides on the seal it is awaited at once, and the step's last bucket
is agreed by it. After a fall-back the switch is tried again after `cooldown_steps` whole
steps."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch

from homagg.control.job_record import GaveUp
from homagg.worker.ddp.agreement import (
    CODEC_FAILED,
    ERROR,
    OK,
    SWITCH_TIMEOUT,
    UNHEALTHY,
    GlooVerdict,
    Resolution,
    SwitchDecision,
    resolve,
)
from homagg.worker.ddp.stats import HookStats
from homagg.worker.job.agent import WorkerAgent

log = logging.getLogger(__name__)

__all__ = ["CODEC_FAILED", "ERROR", "OK", "SWITCH_TIMEOUT", "UNHEALTHY", "FallbackAgreement"]

KIND_TEXT = {
    UNHEALTHY: "an agent is missing or unhealthy",
    CODEC_FAILED: "a codec error",
    SWITCH_TIMEOUT: "the switch path failed (TransportError)",
    ERROR: "an unexpected error",
}
KIND_NAME = {  # the kinds as metric label values (homagg/worker/ddp/metrics.py)
    UNHEALTHY: "unhealthy",
    CODEC_FAILED: "codec_error",
    SWITCH_TIMEOUT: "switch_failed",
    ERROR: "error",
}


class Agreeing(Protocol):
    """What the agreement reads and writes of the hook state."""

    agent: WorkerAgent | None
    unavailable_reason: str
    warned: bool
    rank: int
    steps: int
    stats: HookStats
    unsealed_decision: SwitchDecision | None  # codec="auto"'s, through the switch

    def reduce_max(self, t: torch.Tensor) -> None:
        """MAX over ranks in place."""

    def reduce_max_async(self, t: torch.Tensor) -> Any:
        """MAX over ranks in place, started now; its Work (`wait`) says when it is done."""


def local_health(agent: WorkerAgent | None) -> int:
    """OK when this rank could use the switch now, else UNHEALTHY."""
    return OK if agent is not None and agent.healthy and agent.transport is not None else UNHEALTHY


def local_reason(state: Agreeing) -> str:
    """Why this rank cannot use the switch (empty when it can)."""
    if state.agent is None:
        return state.unavailable_reason
    return "" if local_health(state.agent) == OK else state.agent.unhealthy_reason


def next_chunk(agent: WorkerAgent | None) -> int:
    """This rank's transport chunk counter (0 without a transport)."""
    return agent.transport.next_chunk if agent is not None and agent.transport is not None else 0


def realign(agent: WorkerAgent | None, chunk: int) -> None:
    """Resume past the largest counter any rank reached: each new chunk is newer than
    whatever a failed round left in the slots, so the switch starts it FRESH, and newer than
    any give-up a rank told (at most its counter), so none of them applies any more."""
    if agent is not None and agent.transport is not None:
        agent.transport.next_chunk = chunk + 1


def tell_gave_up(agent: WorkerAgent | None, reason: str) -> None:
    """Tell the other ranks that this one gives up its switch stream (it failed outside the
    transport, or before it): none of them waits on its next chunks any more."""
    if agent is not None and agent.transport is not None:
        transport = agent.transport
        agent.tell_peers(GaveUp(transport.config.rank, transport.next_chunk, reason))


@dataclass
class PendingSeal:
    """A step's seal started over the process group and not read yet: the agreements this
    rank had decided when it sent its vector, the tensor the all_reduce writes, its Work."""

    done: int
    tensor: torch.Tensor
    work: Any  # dist.Work

    def agreed(self, timeout_s: float | None = None) -> GlooVerdict:
        """The agreed vector, waiting for the all_reduce (at most `timeout_s`: RuntimeError
        past it, as a gone peer's collective raises)."""
        if timeout_s is None:
            self.work.wait()
        else:
            self.work.wait(timedelta(seconds=timeout_s))
        return GlooVerdict.from_agreed(self.tensor)


@dataclass
class FallbackAgreement:
    """The agreed path for the next bucket (`use`: None until agreed), the cool-down after a
    fall-back (the switch is agreed again after step `resume_after`), the agreements this
    rank decided (`done`), those decided through the switch since the last one through the
    process group (`unsealed`), and the step's seal in flight (`pending`). Pickles with the
    hook state as plain numbers (a seal in flight is not pickled)."""

    cooldown_steps: int = 5
    use: bool | None = None
    resume_after: int = -1
    done: int = 0
    unsealed: int = 0
    pending: PendingSeal | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "pending": None}

    def agree(self, state: Agreeing, failure: int, stream: int = OK) -> Resolution:
        """One tiny MAX over the ranks of this rank's `GlooVerdict` (its bucket's failure kind,
        what broke its switch stream, its health, whether it missed a decision's answer),
        read by `resolve`; it seals the decision sent through the switch since the last
        one, repaired first (a second all_reduce) when some rank missed its answer. A seal
        in flight is read first: it was issued before this one, on every rank."""
        self.settle(state)
        start = time.perf_counter()
        health, chunk = local_health(state.agent), next_chunk(state.agent)
        decision, state.unsealed_decision = state.unsealed_decision, None
        missed = int(decision is not None and decision.missed)
        mine = GlooVerdict.local(self.done, failure, stream, health, chunk, state.steps, missed)
        t = mine.pack()
        state.reduce_max(t)
        agreed = GlooVerdict.from_agreed(t)
        if agreed.missed:
            if decision is None:  # every rank sent it (its way is agreed): a protocol bug
                raise RuntimeError(f"rank {state.rank}: a decision repair without a decision")
            decision.repair(state.reduce_max)
            state.stats.decision_repairs += 1
        state.stats.agreed(start)
        resolution = resolve(agreed, self.done)
        self.done, self.unsealed = resolution.done, 0
        return resolution

    def start_seal(self, state: Agreeing) -> None:
        """Start the step's seal without waiting for it: a rank that missed a switch answer
        meets the others there (its own agreement, sent at once, pairs with it); `settle`
        reads it before the next bucket's path is chosen. Only where no codec="auto"
        decision rides on it (a repair would have to come before anything else)."""
        if state.unsealed_decision is not None:
            raise RuntimeError("a decision through the switch is sealed by `agree`, not here")
        self.settle(state)
        mine = GlooVerdict.local(
            self.done, OK, OK, local_health(state.agent), next_chunk(state.agent), state.steps
        )
        t = mine.pack()
        self.pending = PendingSeal(self.done, t, state.reduce_max_async(t))
        self.unsealed = 0  # the seal covers them: a second step's end starts no second one

    def settle(self, state: Agreeing, timeout_s: float | None = None) -> None:
        """Read the seal in flight, if any (waiting for it, at most `timeout_s`), and apply
        it: when some rank missed a switch answer, every rank falls back from here on."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        start = time.perf_counter()
        try:
            agreed = pending.agreed(timeout_s)
        except RuntimeError as exc:  # gloo's error names the peer; say where it came from
            raise RuntimeError(
                f"homagg: rank {state.rank}: the last step's seal over the process group "
                f"failed (a rank is gone?): {exc}"
            ) from exc
        state.stats.agreed(start)
        if agreed.missed:  # no rank had a decision unsealed when it was started
            raise RuntimeError(f"rank {state.rank}: a decision repair asked of a step's seal")
        resolution = resolve(agreed, pending.done)
        self.done = resolution.done
        if resolution.kind != OK:
            self.fall_back(state, resolution, local_reason(state))

    def decided_by_switch(self) -> None:
        """One agreement decided by the switch's answer to a verdict packet."""
        self.done += 1
        self.unsealed += 1

    def use_switch(self, state: Agreeing) -> bool:
        """The agreed path for the next bucket (reading the step's seal in flight, and
        agreeing first when the path is not known)."""
        self.settle(state)
        if self.use is None:
            agreed = self.agree(state, OK)
            if agreed.kind == OK:
                self.use = True
                realign(state.agent, agreed.chunk)
            else:
                self.fall_back(state, agreed, local_reason(state), 4)
        return bool(self.use)

    def fall_back(
        self, state: Agreeing, agreed: Resolution, reason: str, stacklevel: int = 3
    ) -> None:
        """Switch -> fallback for `cooldown_steps` steps after the agreed step; warn once
        (`stacklevel`: from the caller of the hook's function that fell back), count,
        realign chunks."""
        text = KIND_TEXT.get(agreed.kind, "unknown")
        state.stats.fallbacks += 1
        state.stats.fallback_reasons[text] += 1
        self.use = False
        self.resume_after = agreed.step + self.cooldown_steps
        realign(state.agent, agreed.chunk)
        if reason:
            text += f" ({reason})"
        if not state.warned:
            state.warned = True
            warnings.warn(
                f"homagg: rank {state.rank} falls back to the process group's all_reduce: "
                f"{text}; retrying the switch every {self.cooldown_steps} step(s)",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
        log.info("rank %d: fallback (%s)", state.rank, text)

    def count_down(self, step: int) -> None:
        """After step `step`: once the cool-down's last step is over (whole steps after the
        agreed one that fell back), agree again before the next bucket."""
        if self.use is False and step >= self.resume_after:
            self.use = None
