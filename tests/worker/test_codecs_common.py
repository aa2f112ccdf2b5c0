"""Shared machinery: switch semantics in simulate, lockstep across workers with very
different local data, pickling, bitmaps and input forms."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import (
    CLTK,
    ErrorFeedback,
    FixedPoint,
    LosslessSparse,
    LowBit,
    Phase,
    PhaseMismatch,
    SparseGrad,
    bitmap,
    combine,
    simulate,
)
from homagg.worker.codecs.base import CorruptResultError, to_sparse

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def all_codecs(world: int) -> dict[str, list]:
    """Per name, one codec per worker."""
    return {
        "fixed": [FixedPoint(world, block=100) for _ in range(world)],
        "fixed8": [FixedPoint(world, bits=8) for _ in range(world)],
        "lossless": [LosslessSparse(world, exp_block=100) for _ in range(world)],
        "lossless-rows": [LosslessSparse(world, support_block=7) for _ in range(world)],
        "lossless-ranked": [LosslessSparse(world, values="ranked") for _ in range(world)],
        "cltk": [CLTK(world, r, ratio=0.05, block=100) for r in range(world)],
        "ef-fixed8": [ErrorFeedback(FixedPoint(world, bits=8)) for _ in range(world)],
        "ef-cltk": [ErrorFeedback(CLTK(world, r, ratio=0.1)) for r in range(world)],
        "ef-lowbit16": [ErrorFeedback(LowBit(world, seed=r)) for r in range(world)],
        "lowbit8-rotated": [LowBit(world, bits=8, rotate=True) for _ in range(world)],
    }


def test_combine_is_the_switch_semantics():
    a = np.array([INT32_MAX, -1, 5, INT32_MIN], np.int32)
    b = np.array([1, 1, -7, -1], np.int32)
    assert combine(Op.ADD, [a, b]).tolist() == [INT32_MIN, 0, -2, INT32_MAX]
    assert combine(Op.OR, [a, b]).tolist() == [INT32_MAX, -1, -3, -1]
    assert combine(Op.MAX, [a, b]).tolist() == [INT32_MAX, 1, 5, -1]
    assert combine(Op.ADD, [a]).tolist() == a.tolist()


def test_every_codec_keeps_lockstep_on_different_local_data():
    rng = np.random.default_rng(1)
    for world in (1, 2, 5):
        for trial in range(6):
            n = int(rng.integers(1, 1500))
            xs = []
            for w in range(world):  # all-zero, single, dense, sparse workers side by side
                kind = (w + trial) % 4
                x = np.zeros(n, np.float32)
                if kind == 1:
                    x[rng.integers(n)] = rng.standard_normal()
                elif kind == 2:
                    x[:] = rng.standard_normal(n)
                elif kind == 3:
                    x[rng.random(n) < 0.05] = 3.0
                xs.append(x)
            for name, codecs in all_codecs(world).items():
                for _ in range(2):  # stateful codecs: a second step too
                    outs = simulate(codecs, xs)  # raises PhaseMismatch on any divergence
                    for out in outs[1:]:
                        assert np.array_equal(out, outs[0]), name


def test_empty_tensors():
    for name, codecs in all_codecs(2).items():
        outs = simulate(codecs, [np.zeros((0, 3), np.float32)] * 2)
        assert outs[0].shape == (0, 3) and outs[0].dtype == np.float32, name


def test_simulate_detects_divergence():
    class Diverging:
        def __init__(self, length: int):
            self.length = length

        def aggregate(self, x):
            yield Phase(Op.ADD, np.zeros(self.length, np.int32))
            return x

    with pytest.raises(PhaseMismatch):
        simulate([Diverging(3), Diverging(4)], [np.zeros(1), np.zeros(1)])

    class FailsOnRankZero:
        def __init__(self, rank: int):
            self.rank = rank

        def aggregate(self, x):
            yield Phase(Op.OR, np.zeros(2, np.int32))
            if self.rank == 0:
                raise CorruptResultError("only here")
            return x

    with pytest.raises(PhaseMismatch, match="only workers"):
        simulate([FailsOnRankZero(0), FailsOnRankZero(1)], [np.zeros(1), np.zeros(1)])


def test_codecs_pickle_with_their_state():
    rng = np.random.default_rng(2)
    world, n = 3, 400
    for name, codecs in all_codecs(world).items():
        gs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
        simulate(codecs, gs)  # build up memory, residuals, step counters
        copies = [pickle.loads(pickle.dumps(c)) for c in codecs]
        gs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
        assert np.array_equal(simulate(codecs, gs)[0], simulate(copies, gs)[0]), name


def test_bitmap_roundtrip():
    rng = np.random.default_rng(3)
    # every way pack takes: a few positions (ufunc.at), runs of words, a packed mask
    for n in (1, 31, 32, 33, 1000, 100_000):
        for density in (0.0, 0.001, 0.06, 0.3, 1.0):
            pos = np.flatnonzero(rng.random(n) < density)
            words = bitmap.pack(pos, n)
            assert words.dtype == np.int32 and words.size == -(-n // 32)
            assert np.array_equal(bitmap.unpack(words, n), pos)
    words = bitmap.pack(np.array([0, 31]), 32)
    assert words.tolist() == [1 | INT32_MIN]
    with pytest.raises(CorruptResultError):
        bitmap.unpack(bitmap.pack(np.array([40]), 64), 40)


def test_to_sparse_coalesces_and_drops_zeros():
    idx, vals, n = to_sparse(SparseGrad(np.array([5, 1, 5, 3]), np.array([1.0, 2.0, 0.5, 0.0]), 8))
    assert idx.tolist() == [1, 5] and vals.tolist() == [2.0, 1.5] and n == 8
    with pytest.raises(ValueError):
        to_sparse((np.array([9]), np.array([1.0]), 8))
    dense = np.array([[0, -0.0, 2], [0, 1, 0]], np.float64)
    idx, vals, n = to_sparse(dense)
    assert idx.tolist() == [2, 4] and vals.dtype == np.float32 and n == 6
