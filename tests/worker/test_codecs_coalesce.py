"""Several codecs' phases coalesced into one sequence (homagg/worker/codecs/coalesce.py):
every part decodes what it decodes alone, in as few phases as the ops allow, lockstep across
workers; a wrong-sized answer or a part's error ends them all."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import (
    CLTK,
    CodecError,
    FixedPoint,
    LosslessSparse,
    LowBit,
    Phase,
    SparseRows,
    drive,
)
from homagg.worker.codecs.base import CorruptResultError
from homagg.worker.codecs.coalesce import coalesced_phases, next_op

W = 4


def parts_of(rank: int, seed: int = 0) -> tuple[list, list]:
    """One worker's codecs and inputs: a sparse table's rows (lossless by rows), a dense
    vector (fixed point), a mostly-zero one (lossless), 16-bit lanes and CLT-k."""
    rng = np.random.default_rng(seed * 100 + rank)
    rows = np.sort(rng.choice(500, 20, replace=False)).astype(np.int64)
    table = SparseRows(rows, rng.normal(size=(20, 8)).astype(np.float32), 500)
    dense = rng.normal(size=3000).astype(np.float32)
    sparse = np.zeros(5000, np.float32)
    sparse[rng.choice(5000, 40, replace=False)] = rng.normal(size=40)
    lanes = rng.normal(size=700).astype(np.float32)
    topk = rng.normal(size=900).astype(np.float32)
    codecs = [
        LosslessSparse(W, support_block=8),
        FixedPoint(W),
        LosslessSparse(W),
        LowBit(W, seed=rank),
        CLTK(W, rank, ratio=0.1),
    ]
    inputs = [table, dense, sparse, lanes, topk]
    return codecs, inputs


def generators(codecs: list, inputs: list) -> list:
    """Each part's phases (rows through aggregate_rows)."""
    return [
        c.aggregate_rows(x) if isinstance(x, SparseRows) else c.aggregate(x)
        for c, x in zip(codecs, inputs)
    ]


def same(a, b) -> bool:
    if isinstance(a, SparseRows):
        return np.array_equal(a.rows, b.rows) and np.array_equal(a.values, b.values)
    return np.array_equal(a, b)


def test_every_part_decodes_what_it_decodes_alone():
    for seed in range(3):
        alone = []
        counts = []
        for i in range(5):
            log: list[Phase] = []
            gens = [generators(*parts_of(r, seed))[i] for r in range(W)]
            alone.append(drive(gens, phases_log=log))
            counts.append(len(log))
        log = []
        together = drive(
            [coalesced_phases(generators(*parts_of(r, seed))) for r in range(W)], phases_log=log
        )
        for r in range(W):
            for i in range(5):
                assert same(together[r][i], alone[i][r]), (seed, r, i)
        # lossless (OR, ADD), fixed point and lanes (MAX, ADD/ADD16), CLT-k (MAX, ADD): the
        # MAX phases and the OR phases, then ADD and ADD16
        assert [p.op for p in log] == [Op.MAX, Op.OR, Op.ADD, Op.ADD16]
        assert sum(counts) == 10 and len(log) == 4


def test_equal_parts_take_the_phases_of_one():
    def gens(rank: int) -> list:
        rng = np.random.default_rng(rank)
        out = []
        for _ in range(3):
            x = np.zeros(4000, np.float32)
            x[rng.choice(4000, 30, replace=False)] = rng.normal(size=30)
            out.append(LosslessSparse(W).aggregate(x))
        return out

    log: list[Phase] = []
    drive([coalesced_phases(gens(r)) for r in range(W)], phases_log=log)
    one: list[Phase] = []
    drive([gens(r)[0] for r in range(W)], phases_log=one)
    assert [p.op for p in log] == [p.op for p in one]


def test_agreeing_ops_go_before_adds_and_the_most_waited_on_first():
    assert next_op([Op.ADD, Op.ADD, Op.MAX]) == Op.MAX
    assert next_op([Op.ADD8, Op.OR, Op.MAX, Op.MAX]) == Op.MAX
    assert next_op([Op.OR, Op.MAX]) == Op.OR  # a tie: the lower op number
    assert next_op([Op.ADD8, Op.ADD, Op.ADD8]) == Op.ADD8


def raw(ops: list[Op], sizes: list[int], seen: list):
    """Phases of the given ops and sizes whose cells are their own position; records what
    each phase got back and returns it."""
    for op, n in zip(ops, sizes):
        got = yield Phase(op, np.arange(n, dtype=np.int32))
        seen.append(np.asarray(got).copy())
    return len(seen)


def test_each_part_gets_its_own_slice_also_empty_ones():
    seen_a: list = []
    seen_b: list = []
    a = raw([Op.OR, Op.ADD], [3, 0], seen_a)
    b = raw([Op.OR, Op.ADD], [0, 4], seen_b)
    gen = coalesced_phases([a, b])
    phase = next(gen)
    assert phase.op == Op.OR and phase.cells.tolist() == [0, 1, 2]
    phase = gen.send(np.array([7, 8, 9], np.int32))
    assert phase.op == Op.ADD and phase.cells.tolist() == [0, 1, 2, 3]
    with pytest.raises(StopIteration) as done:
        gen.send(np.array([10, 11, 12, 13], np.int32))
    assert done.value.value == [2, 2]
    assert [s.tolist() for s in seen_a] == [[7, 8, 9], []]
    assert [s.tolist() for s in seen_b] == [[], [10, 11, 12, 13]]


def test_an_answer_of_the_wrong_size_is_corrupt_and_closes_every_part():
    seen: list = []
    parts = [raw([Op.ADD], [2], seen), raw([Op.ADD, Op.ADD], [2, 2], seen)]
    gen = coalesced_phases(parts)
    next(gen)
    with pytest.raises(CorruptResultError, match="3 cells received"):
        gen.send(np.zeros(3, np.int32))
    for part in parts:  # none is left suspended
        with pytest.raises(StopIteration):
            next(part)


def test_a_part_that_raises_ends_them_all_with_its_error():
    def failing():
        yield Phase(Op.MAX, np.zeros(1, np.int32))
        raise CodecError("a worker's gradient is not finite")

    seen: list = []
    other = raw([Op.MAX, Op.ADD], [1, 5], seen)
    gen = coalesced_phases([other, failing()])
    assert next(gen).cells.size == 2
    with pytest.raises(CodecError, match="not finite"):
        gen.send(np.zeros(2, np.int32))
    with pytest.raises(StopIteration):
        next(other)


def test_no_parts_no_phases():
    with pytest.raises(StopIteration) as done:
        next(coalesced_phases([]))
    assert done.value.value == []
