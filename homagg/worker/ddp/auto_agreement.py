"""codec="auto"'s per-step decision agreed through the switch (docs/worker.md: the decision
through the switch): its measurement cells (auto/measurements.py, `to_cells`) in one MAX
packet, or, where the switch is not the agreed path, one MAX (gathered_max.py) over the hook's
process group as before. Both ways agree the same int32 cells, so the same decisions.

The way is chosen from agreed state only (the agreed path is the switch, and the next
step runs a bucket on it, whose seal comes at no extra cost), so every rank sends the
packet or none does. A rank that misses the answer (the switch died between its copies,
its stream broke, its agent is unhealthy) goes to the process group at once with
`missed` set; the others meet it at their next agreement there (their next switch bucket
fails, or the step's seal: the decision counts as unsealed; after the last step, the
seal close() runs), and every rank all_reduces
the cells it had sent (agreement.py, `SwitchDecision.repair`): the same answer everywhere,
and every rank falls back together."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import numpy as np
import torch

from homagg.worker.auto.control import HOST
from homagg.worker.auto.measurements import Taken, from_cells
from homagg.worker.ddp.agreement import OK, SWITCH_TIMEOUT, SwitchDecision
from homagg.worker.ddp.fallback import local_health, local_reason, tell_gave_up
from homagg.worker.ddp.gathered_max import GatheredMax
from homagg.worker.transport.switch_transport import TransportError

if TYPE_CHECKING:
    from homagg.worker.ddp.hook import SwitchHookState

log = logging.getLogger(__name__)


@dataclass
class PendingDecision:
    """One step's decision in flight: its buckets, what they ran, and either the switch's
    (or the repair's) agreed cells or the process group's MAX still running."""

    indices: list[int]
    taken: Taken
    switch: SwitchDecision | None = None
    work: GatheredMax | None = None  # the process group's way: its MAX started
    reduced: torch.Tensor | None = None  # the tensor that MAX writes (int64 cells)

    def vector(self) -> np.ndarray:
        """The agreed packed vector (`Measurements.pack` layout), waiting for the process
        group's all_reduce when it went that way."""
        if self.switch is not None:
            if self.switch.agreed is None:  # a missed answer is repaired before it is read
                raise RuntimeError("codec='auto': a decision read before it was agreed")
            return from_cells(self.switch.agreed)
        assert self.work is not None and self.reduced is not None
        self.work.wait()
        return from_cells(self.reduced.numpy())

    def finish(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for an all_reduce still running (close())."""
        if self.work is not None:
            self.work.wait(timedelta(seconds=timeout_s))


def through_switch(state: SwitchHookState, indices: Sequence[int]) -> bool:
    """Whether this step's decision goes through the switch: the hook agrees (and decides)
    through it,
    the switch is the agreed path, and the next step runs a bucket on it (its seal comes
    with that bucket). Agreed state only: every rank answers alike."""
    ctl = state.controller
    return (
        ctl is not None
        and state.switch_agreements
        and state.switch_decisions
        and state.fallback.use is True
        and any(ctl.choice(i).method != HOST for i in indices)
    )


def start_decision(
    state: SwitchHookState, indices: list[int], cells: np.ndarray, taken: Taken
) -> PendingDecision:
    """This step's cells on their way (`through_switch`); a rank that missed the switch's
    answer has it repaired over the process group before this returns."""
    if not through_switch(state, indices):
        reduced = torch.from_numpy(cells.astype(np.int64))
        work = state.reduce_max_async(reduced)
        return PendingDecision(indices, taken, work=work, reduced=reduced)
    decision = SwitchDecision(cells)
    start = time.perf_counter()
    reason = _ask_switch(state, decision)
    state.unsealed_decision = decision  # sealed (and repaired) by the next agreement
    if not decision.missed:
        state.fallback.decided_by_switch()
        state.stats.decided_by_switch(start)
        return PendingDecision(indices, taken, switch=decision)
    agreed = state.fallback.agree(state, OK, SWITCH_TIMEOUT)  # the others meet it; repaired
    if agreed.kind != OK:
        state.fallback.fall_back(state, agreed, reason or local_reason(state))
    return PendingDecision(indices, taken, switch=decision)


def _ask_switch(state: SwitchHookState, decision: SwitchDecision) -> str:
    """Send the decision's packet and wait for its answer (kept in `decision`); why it
    missed it, else ""."""
    agent = state.agent
    if agent is None or agent.transport is None or local_health(agent) != OK:
        reason = local_reason(state) or "no transport"
        tell_gave_up(agent, reason)  # nobody waits for this rank's packet
        return reason
    try:
        agent.transport.run(decision.phases())
        return ""
    except TransportError as exc:
        return str(exc)
    except Exception as exc:
        log.exception("rank %d: the decision through the switch failed", state.rank)
        tell_gave_up(agent, str(exc))
        return f"{type(exc).__name__}: {exc}"
