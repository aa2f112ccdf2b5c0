"""A round through the switch, agreed by every rank: one bucket, or several whose phases are
coalesced (the blocking hook's small buckets). What goes to the switch (`Part`: a bucket's
`Payload`, a gradient for its codec, a bucket that drives its codec itself, or raw phases),
the agreed sums or the agreed fall-back (`agreed_sums`; `switch_sums` for DDP's buckets),
and a whole bucket averaged in place by either path (`aggregate_bucket`: the communication
thread's job, and DeAR's)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from homagg.worker.auto.control import HOST, Choice
from homagg.worker.auto.host_path import nonzero_share
from homagg.worker.codecs import Codec, CodecError, GradInput, Phase
from homagg.worker.codecs.coalesce import coalesced_phases
from homagg.worker.ddp import sparse_bucket
from homagg.worker.ddp.agreement import SwitchRound
from homagg.worker.ddp.fallback import (
    CODEC_FAILED,
    ERROR,
    OK,
    SWITCH_TIMEOUT,
    UNHEALTHY,
    local_health,
    local_reason,
    tell_gave_up,
)
from homagg.worker.transport.switch_transport import TransportError

if TYPE_CHECKING:
    from homagg.worker.ddp.hook import SwitchHookState

log = logging.getLogger(__name__)

Phases = Generator[Phase, np.ndarray, np.ndarray]
RoundPhases = Generator[Phase, np.ndarray, list[np.ndarray]]


@dataclass(frozen=True)
class Gradient:
    """A gradient the bucket's codec aggregates (`codec.aggregate(grad)`)."""

    grad: GradInput


@dataclass(frozen=True)
class Via:
    """A bucket that drives its codec itself: `drive(codec)` makes the phases (a sparse
    bucket: homagg/worker/ddp/sparse_bucket.py)."""

    drive: Callable[[Codec], Phases]


@dataclass(frozen=True)
class RawPhases:
    """Phases run as they are, without a codec (a raw switch operation)."""

    phases: Phases


Payload = Gradient | Via | RawPhases


@dataclass(frozen=True)
class Part:
    """One bucket of a switch round: bucket `index`'s `payload`, `length` dense cells."""

    index: int
    payload: Payload
    length: int


def _phases(state: SwitchHookState, part: Part) -> Phases:
    """The phases the transport runs for one part (its bucket's codec unless raw)."""
    payload = part.payload
    if isinstance(payload, RawPhases):
        return payload.phases
    codec = state.codec_for(part.index, part.length)
    return payload.drive(codec) if isinstance(payload, Via) else codec.aggregate(payload.grad)


def _round_phases(state: SwitchHookState, parts: Sequence[Part]) -> RoundPhases:
    """The round's phases: one part's as they are, several coalesced (codecs/coalesce.py); either
    way returning the list of the parts' sums."""
    if len(parts) == 1:
        return _listed(_phases(state, parts[0]))
    return coalesced_phases([_phases(state, part) for part in parts])


def _listed(inner: Phases) -> RoundPhases:
    """`inner`'s phases, its sum returned as a list of one."""
    return [(yield from inner)]


def _through_switch(
    state: SwitchHookState, parts: Sequence[Part], rnd: SwitchRound | None
) -> tuple[list[np.ndarray] | None, int, str]:
    """(the parts' decoded sums, OK, "") or (None, failure kind, reason) for one round on
    this rank; with `rnd`, the round's phases are followed by its verdict packet (what the
    rank learnt is in `rnd`, whatever failed)."""
    agent = state.agent
    if agent is None or agent.transport is None or not agent.healthy:
        return None, UNHEALTHY, local_reason(state)
    transport = agent.transport
    phases: Generator[Phase, np.ndarray, Any] = _round_phases(state, parts)
    if rnd is not None:
        phases = rnd.phases(phases, lambda: local_health(state.agent))
    with state.stats.switch_run(transport):
        try:
            return transport.run(phases), OK, ""
        except TransportError as exc:
            return None, SWITCH_TIMEOUT, str(exc)
        except CodecError as exc:
            return None, CODEC_FAILED, f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            log.exception("rank %d: switch aggregation failed", state.rank)
            return None, ERROR, f"{type(exc).__name__}: {exc}"


def agreed_sum(
    state: SwitchHookState, index: int, payload: Payload, length: int, last: bool = True
) -> np.ndarray | None:
    """The switch's sum of `payload` (`length` dense cells; bucket `index`'s codec) when
    every rank's succeeded, else None after the agreed fall-back (see agreed_sums)."""
    sums = agreed_sums(state, [Part(index, payload, length)], last)
    return None if sums is None else sums[0]


def agreed_sums(
    state: SwitchHookState, parts: Sequence[Part], last: bool = True
) -> list[np.ndarray] | None:
    """The switch's sums of the parts, in one round (their phases coalesced), when every rank's
    round succeeded, else None after the agreed fall-back. A round is agreed by a verdict
    packet through the switch (when the state agrees through the switch); the step's
    `last` one, where codec="auto"'s decision rides on the seal, through the process
    group, which seals the step (elsewhere the step's end starts the seal: `seal_step`)."""
    verdict = state.switch_agreements and (not last or state.seal_later)
    rnd = SwitchRound() if verdict else None
    out, failure, reason = _through_switch(state, parts, rnd)
    fallback = state.fallback
    if rnd is not None and rnd.verdict is not None:  # decided by the switch
        fallback.decided_by_switch()
        state.stats.switch_agreements += 1
        _count_switch_buckets(state, parts)
        if rnd.verdict.health != OK:  # kept; the next bucket falls back, sealed on gloo
            fallback.fall_back(state, fallback.agree(state, OK, rnd.verdict.health), "")
        return out
    stream = OK
    if rnd is not None and rnd.summed is not None:  # phases done, the verdict unanswered
        out, failure, stream = rnd.summed, OK, failure
    elif failure in (UNHEALTHY, CODEC_FAILED, ERROR):  # none may wait on this rank's chunks
        tell_gave_up(state.agent, reason)
    agreed = fallback.agree(state, failure, stream)
    if not agreed.keep:
        fallback.fall_back(state, agreed, reason)
        return None
    assert out is not None
    _count_switch_buckets(state, parts)
    if agreed.kind != OK:  # this result is good; the next bucket takes the fallback
        fallback.fall_back(state, agreed, reason or local_reason(state))
    return out


def seal_step(state: SwitchHookState) -> None:
    """At a step's end: when agreements since the last one through the process group were
    decided through the switch only, one through the process group, where a rank that
    missed a switch answer meets the others. Started and read before the next bucket, or,
    where codec="auto"'s decision rides on it (its repair comes first), awaited here."""
    if not state.fallback.unsealed:
        return
    if state.seal_later:
        state.fallback.start_seal(state)
    else:
        agreed = state.fallback.agree(state, OK)
        if agreed.kind != OK:
            state.fallback.fall_back(state, agreed, local_reason(state))


def _count_switch_buckets(state: SwitchHookState, parts: Sequence[Part]) -> None:
    """The round's buckets summed by the switch (each `length` float32 cells)."""
    state.stats.switch_buckets += len(parts)
    state.stats.dense_bytes += sum(part.length for part in parts) * 4


def switch_or_none(
    state: SwitchHookState, index: int, buf: torch.Tensor, last: bool = True
) -> torch.Tensor | None:
    """The bucket summed by the switch into `buf`, or None when the ranks agreed to fall
    back (agreed on every rank either way; `last`: the step's last bucket, see agreed_sums)."""
    sums = switch_sums(state, [(index, buf)], last)
    return None if sums is None else sums[0]


def switch_sums(
    state: SwitchHookState, buckets: Sequence[tuple[int, torch.Tensor]], last: bool = True
) -> list[torch.Tensor] | None:
    """The buckets (index, buffer) summed by the switch in one round, each into its own
    buffer (a sparse one as COO), or None when the ranks agreed that all of them fall back
    (agreed on every rank either way; `last`: the round holds the step's last bucket)."""
    parts: list[Part] = []
    finish: list[Callable[[np.ndarray], torch.Tensor]] = []
    for index, buf in buckets:
        if buf.is_sparse:  # a sparse parameter's bucket: its rows, never densified
            sparse = sparse_bucket.SparseBucket(buf)
            parts.append(Part(index, Via(sparse.phases), buf.numel()))
            finish.append(sparse.result)
        else:
            grad = buf.detach().reshape(-1).to("cpu", torch.float32).numpy()
            parts.append(Part(index, Gradient(grad), grad.size))
            finish.append(functools.partial(_into_bucket, buf))
    sums = agreed_sums(state, parts, last)
    return None if sums is None else [f(summed) for f, summed in zip(finish, sums)]


def _into_bucket(buf: torch.Tensor, out: np.ndarray) -> torch.Tensor:
    """The decoded sum written into the bucket's own buffer (codecs may return a buffer
    they reuse, so nothing may keep referring to it)."""
    if buf.device.type == "cpu" and buf.dtype == torch.float32 and buf.is_contiguous():
        np.copyto(buf.detach().numpy().reshape(-1), out.reshape(-1))
    else:
        buf.copy_(torch.from_numpy(np.array(out, np.float32)).reshape(buf.shape))
    return buf


def aggregate_bucket(
    state: SwitchHookState, index: int, buf: torch.Tensor, last: bool = True
) -> torch.Tensor:
    """Bucket `index` summed (through the switch, or agreed by every rank by the hook
    group's all_reduce) and divided by the world size, in place, before returning: the
    communication thread's job (and DeAR's; `last`: the step's last bucket, see
    agreed_sum). codec="auto": the controller's path, timed."""
    start, sent = time.perf_counter(), state.stats.wire_cells
    choice = state.controller.choice(index) if state.controller is not None else None
    result: torch.Tensor | None = None
    ran: Choice | None = choice
    if choice is not None and choice.method == HOST:
        state.host_all_reduce(buf)
        state.stats.host_buckets += 1
        result = buf
    elif state.use_switch():
        result = switch_or_none(state, index, buf, last)
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
