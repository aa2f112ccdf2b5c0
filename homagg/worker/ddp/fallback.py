"""The collective fallback agreement: for every bucket all ranks take the same path, the
switch or the process group's all_reduce (docs/worker.md: the decision protocol and its
cost). Each decision is one tiny MAX all_reduce of a `Verdict`; after a fall-back the switch
is tried again after `cooldown_steps` whole steps."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from homagg.worker.ddp.stats import HookStats
from homagg.worker.job.agent import WorkerAgent

log = logging.getLogger(__name__)

# Failure kinds, exchanged as MAX over ranks: the highest one names the agreed reason.
OK, UNHEALTHY, CODEC_FAILED, SWITCH_TIMEOUT, ERROR = 0, 1, 2, 3, 4
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


class Verdict(NamedTuple):
    """The agreement's vector by name: a rank's failure kind, health kind and next chunk
    (agreed: the MAX of each over ranks)."""

    failure: int
    health: int
    chunk: int

    def pack(self) -> torch.Tensor:
        """The vector the MAX all_reduce takes (int64, in field order)."""
        return torch.tensor(list(self), dtype=torch.int64)

    @classmethod
    def from_agreed(cls, t: torch.Tensor) -> Verdict:
        """The verdict read back from the reduced vector."""
        failure, health, chunk = (int(v) for v in t.tolist())
        return cls(failure, health, chunk)


class Agreeing(Protocol):
    """What the agreement reads and writes of the hook state."""

    agent: WorkerAgent | None
    unavailable_reason: str
    warned: bool
    rank: int
    steps: int
    stats: HookStats

    def reduce_max(self, t: torch.Tensor) -> None:
        """MAX over ranks in place."""


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
    """Resume at the largest counter any rank reached: each new chunk is newer than whatever
    a failed round left in the slots, so the switch starts it FRESH."""
    if agent is not None and agent.transport is not None:
        agent.transport.next_chunk = chunk


@dataclass
class FallbackAgreement:
    """The agreed path for the next bucket (`use`: None until agreed) and the cool-down
    after a fall-back. Plain numbers: pickles with the hook state."""

    cooldown_steps: int = 5
    use: bool | None = None
    cooldown_left: int = 0
    fell_back_in_step: int = -1

    def agree(self, state: Agreeing, failure: int, health: int) -> Verdict:
        """MAX over ranks of (failure kind, health kind, next chunk): one tiny all_reduce."""
        start = time.perf_counter()
        t = Verdict(failure, health, next_chunk(state.agent)).pack()
        state.reduce_max(t)
        state.stats.agreed(start)
        return Verdict.from_agreed(t)

    def use_switch(self, state: Agreeing) -> bool:
        """The agreed path for the next bucket (agreeing first when it is not known)."""
        if self.use is None:
            agreed = self.agree(state, OK, local_health(state.agent))
            if agreed.health == OK:
                self.use = True
                realign(state.agent, agreed.chunk)
            else:
                self.fall_back(state, agreed.health, local_reason(state), agreed.chunk, 4)
        return bool(self.use)

    def fall_back(
        self, state: Agreeing, kind: int, reason: str, chunk: int, stacklevel: int = 3
    ) -> None:
        """Switch -> fallback for `cooldown_steps` steps; warn once (`stacklevel`: from
        the caller of the hook's function that fell back), count, realign chunks."""
        text = KIND_TEXT.get(kind, "unknown")
        state.stats.fallbacks += 1
        state.stats.fallback_reasons[text] += 1
        self.use = False
        self.cooldown_left = self.cooldown_steps
        self.fell_back_in_step = state.steps
        realign(state.agent, chunk)
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
        """After step `step`: one whole step of the cool-down less (not the step that fell
        back); at its end, agree again before the next bucket."""
        if self.use is False:
            if self.fell_back_in_step != step:
                self.cooldown_left -= 1
            if self.cooldown_left <= 0:
                self.use = None
