"""The lossless codec's rows (`aggregate_rows`, what a sparse embedding gradient goes
through): the same sums bit for bit as the flat codec with one support key per row, every
worker's rows in the union (zero rows too), cells in proportion to the rows, and a row
lost from the union detected."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import CorruptResultError, LosslessSparse, Phase, SparseGrad, SparseRows
from homagg.worker.codecs.bitmap import bitmap_words
from homagg.worker.codecs.count_sketch import FINGERPRINT_CELLS
from homagg.worker.codecs.exponent import EXP_BIT_WORDS, num_blocks
from homagg.worker.codecs.simulate import PhaseMismatch, Tamper, drive


def random_rows(rng: np.random.Generator, world: int, nrows: int, width: int) -> list[SparseRows]:
    """Each worker's rows: a random subset (shared rows, rows of zeros, values that cancel
    across workers, values of very different sizes)."""
    shared = rng.choice(nrows, min(nrows, int(rng.integers(0, 6))), replace=False)
    out = []
    for _ in range(world):
        own = rng.choice(nrows, int(rng.integers(0, min(nrows, 40) + 1)), replace=False)
        rows = np.union1d(own, shared).astype(np.int64)
        scale = 10.0 ** rng.uniform(-6, 6, (rows.size, 1))
        values = (rng.standard_normal((rows.size, width)) * scale).astype(np.float32)
        values[rng.random(rows.size) < 0.2] = 0  # rows looked up, gradient zero
        values[rng.random(values.shape) < 0.1] = 0  # zeros inside rows
        out.append(SparseRows(rows, values, nrows))
    if world > 1 and shared.size:  # a shared row that sums to zero
        at = [int(np.searchsorted(x.rows, shared[0])) for x in out[:2]]
        out[1].values[at[1]] = -out[0].values[at[0]]
        for x, i in zip(out[2:], (int(np.searchsorted(x.rows, shared[0])) for x in out[2:])):
            x.values[i] = 0
    return out


def as_flat(x: SparseRows) -> SparseGrad:
    width = x.values.shape[1]
    idx = (x.rows[:, None] * width + np.arange(width)).reshape(-1)
    return SparseGrad(idx, x.values.reshape(-1), x.nrows * width)


def by_rows(codecs: list[LosslessSparse], xs: list[SparseRows], **kw) -> list[SparseRows]:
    return drive([c.aggregate_rows(x) for c, x in zip(codecs, xs)], **kw)


@pytest.mark.parametrize("mode", ["ranked", "sketch"])
def test_rows_equal_the_flat_codec_bit_for_bit(mode):
    rng = np.random.default_rng(14)
    for trial in range(300):
        world = (2, 3, 4, 8)[trial % 4]
        nrows, width = int(rng.integers(1, 3000)), int(rng.integers(1, 20))
        exp_block = int(rng.choice([16, 1000, 16384]))
        xs = random_rows(rng, world, nrows, width)
        opts = {"exp_block": exp_block, "values": mode}
        flat = drive(
            [LosslessSparse(world, support_block=width, **opts).aggregate(as_flat(x)) for x in xs]
        )[0].reshape(nrows, width)
        union = np.unique(np.concatenate([x.rows for x in xs]))
        for got in by_rows([LosslessSparse(world, **opts) for _ in xs], xs):
            assert np.array_equal(got.rows, union) and got.nrows == nrows
            assert got.values.dtype == np.float32 and got.values.shape == (union.size, width)
            assert np.array_equal(got.values.view(np.int32), flat[union].view(np.int32))
        assert not np.any(np.delete(flat, union, axis=0))  # nothing outside the rows


def test_cells_follow_the_rows_not_the_elements():
    """One bit per row in the index phase (two levels for a big table) and one cell per
    element of the union's rows in the value phase."""
    nrows, width, world = 50_000, 16, 2
    xs = [
        SparseRows(np.array(rows, np.int64), np.ones((len(rows), width), np.float32), nrows)
        for rows in ([3, 700, 49_999], [3, 12])
    ]
    log: list[Phase] = []
    by_rows([LosslessSparse(world, index_levels=1) for _ in xs], xs, phases_log=log)
    assert [p.op for p in log] == [Op.OR, Op.ADD]
    exps = EXP_BIT_WORDS * num_blocks(nrows * width, 16384)  # the exponents ride the OR phase
    sizes = [exps + bitmap_words(nrows) + 1]
    witness = num_blocks(nrows * width, 16384)  # a cell per block: "my exponent is agreed"
    assert [p.cells.size for p in log] == [*sizes, 4 * width + witness + FINGERPRINT_CELLS]
    log = []
    by_rows([LosslessSparse(world) for _ in xs], xs, phases_log=log)  # two levels by size
    assert [p.op for p in log] == [Op.OR, Op.OR, Op.ADD]
    assert log[0].cells.size == exps + bitmap_words(bitmap_words(nrows)) + 1
    assert log[1].cells.size == 3


def test_no_rows_anywhere_and_an_empty_table():
    xs = [SparseRows(np.zeros(0, np.int64), np.zeros((0, 4), np.float32), 10)] * 2
    log: list[Phase] = []
    for got in by_rows([LosslessSparse(2) for _ in xs], xs, phases_log=log):
        assert got.rows.size == 0 and got.values.shape == (0, 4)
    assert [p.op for p in log] == [Op.OR]  # an empty union needs no value phase
    empty = [SparseRows(np.zeros(0, np.int64), np.zeros((0, 4), np.float32), 0)] * 2
    log = []
    assert by_rows([LosslessSparse(2) for _ in empty], empty, phases_log=log)[0].nrows == 0
    assert log == []


@pytest.mark.parametrize(
    "rows, shape, nrows",
    [
        ([2, 1], (2, 3), 5),  # unsorted
        ([1, 1], (2, 3), 5),  # repeated
        ([1, 5], (2, 3), 5),  # outside the table
        ([-1, 2], (2, 3), 5),
        ([1, 2], (3, 3), 5),  # a value row too many
        ([1, 2], (2, 0), 5),  # no width
    ],
)
def test_bad_rows_are_a_clear_error(rows, shape, nrows):
    x = SparseRows(np.array(rows), np.zeros(shape, np.float32), nrows)
    with pytest.raises(ValueError, match="sparse rows"):
        next(LosslessSparse(1).aggregate_rows(x))


def test_a_row_lost_from_the_union_is_detected():
    """A zero row has no value for the fingerprint to miss: the worker that sent it sees
    it missing from the union; a lost row with values fails the fingerprint everywhere."""
    width, nrows = 4, 100
    xs = [
        SparseRows(np.array([7, 40]), np.array([[0] * width, [1] * width], np.float32), nrows),
        SparseRows(np.array([40, 90]), np.full((2, width), 2, np.float32), nrows),
    ]

    def clear(row: int) -> Tamper:
        def tamper(step: int, phase: Phase, c: np.ndarray) -> np.ndarray:
            if phase.op == Op.OR:
                c = c.copy()
                at = EXP_BIT_WORDS + row // 32  # after the one block's exponent bits
                c.view(np.uint32)[at] &= ~np.uint32(1 << (row % 32))
            return c

        return tamper

    gens = [LosslessSparse(2).aggregate_rows(x) for x in xs]
    with pytest.raises(PhaseMismatch, match=r"only workers \[0\] failed") as caught:
        drive(gens, tamper=clear(7))  # worker 0 alone: the hook's agreement tells the others
    assert isinstance(caught.value.__cause__, CorruptResultError)
    assert "a row this worker sent is missing from the rows' union" in str(caught.value.__cause__)
    gens = [LosslessSparse(2).aggregate_rows(x) for x in xs]
    with pytest.raises(CorruptResultError, match="fingerprint"):
        drive(gens, tamper=clear(90))
