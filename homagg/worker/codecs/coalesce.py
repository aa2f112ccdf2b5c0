"""Several codecs' phases coalesced into one phase sequence: each phase carries, end to end,
the cells of every part whose next phase has that op, and hands each part its own slice of
the combination. A switch combines cells one by one, so a slice is what the part alone
would have received; the parts (a step's small buckets) share round trips: two sparse
buckets of the lossless codec take two phases, not four.

Every worker coalesces the same parts in the same order, and each part's phases have the
same op and length on every worker, so the coalesced phases do too (as `Phase` asks)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from homagg.wire.constants import Op

from .base import CorruptResultError, Phase

PartPhases = Generator[Phase, np.ndarray, Any]

_AGREEING = (Op.MAX, Op.OR)  # the ops a codec's phases use before its adding phase


def coalesced_phases(parts: Sequence[PartPhases]) -> Generator[Phase, np.ndarray, list[Any]]:
    """The parts' phases, coalesced: each phase takes every pending phase of one op
    (`next_op`); returns the parts' return values, in order. A part that raises ends them
    all (its error propagates)."""
    results: list[Any] = [None] * len(parts)
    pending: dict[int, Phase] = {}
    try:
        for i, part in enumerate(parts):
            _advance(part, i, None, pending, results)
        while pending:
            op = next_op([phase.op for phase in pending.values()])
            members = [i for i in sorted(pending) if pending[i].op == op]
            cells = [np.asarray(pending[i].cells, np.int32).reshape(-1) for i in members]
            sizes = [c.size for c in cells]
            got = yield Phase(Op(op), cells[0] if len(cells) == 1 else np.concatenate(cells))
            got = np.asarray(got)
            if got.size != sum(sizes):
                raise CorruptResultError(
                    f"{got.size} cells received for a coalesced {Op(op).name} phase of {sum(sizes)}"
                )
            for i, piece in zip(members, np.split(got, np.cumsum(sizes)[:-1])):
                del pending[i]
                _advance(parts[i], i, piece, pending, results)
        return results

    finally:  # a part that raised, or a close: none is left suspended
        for part in parts:
            part.close()


def next_op(ops: Sequence[Op]) -> Op:
    """The op of the next coalesced phase, given the parts' pending ones: a MAX or OR
    phase first, since the codecs agree exponents and indices (MAX, OR) before they add
    values, so a part still agreeing lets the others' adds wait and join it; then the op
    most parts wait on (ties: the lower op number). The same on every worker."""
    return min(set(ops), key=lambda op: (op not in _AGREEING, -ops.count(op), int(op)))


def _advance(
    part: PartPhases,
    i: int,
    reply: np.ndarray | None,
    pending: dict[int, Phase],
    results: list[Any],
) -> None:
    """Part `i` given `reply` (None: started): its next phase into `pending`, or its return
    value into `results` once it is done."""
    try:
        pending[i] = next(part) if reply is None else part.send(reply)
    except StopIteration as done:
        results[i] = done.value
