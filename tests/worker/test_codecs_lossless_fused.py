"""The lossless codec with its exponents in the OR phase (the default, one round trip less)
against the same codec with them in a MAX phase of their own (the former phases, the
oracle): the same sums bit for bit on the edges (empty and all-zero buckets, all-dense
ones, float32's extremes, disjoint and identical supports, rows and flat, ranked and
sketch, one and two index levels), one phase less, and the same errors."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import LosslessSparse, NonFiniteError, SparseRows
from homagg.worker.codecs.exponent import (
    EXP_NONFINITE,
    EXP_ZERO,
    exponents_as_bits,
    exponents_from_bits,
)
from homagg.worker.codecs.simulate import drive, simulate

F32 = np.finfo(np.float32)
TINY = np.float32(1e-45)  # the smallest subnormal


def both(world: int, xs: list, **options) -> tuple[list, list, list, list]:
    """(fused sums, their phases, oracle sums, its phases) of the same inputs."""
    logs: tuple[list, list] = ([], [])
    outs = [
        simulate([LosslessSparse(world, exponents=e, **options) for _ in xs], xs, phases_log=log)
        for e, log in zip(("or", "max"), logs, strict=True)
    ]
    return outs[0], logs[0], outs[1], logs[1]


def assert_same(fused: list, oracle: list) -> None:
    for f, o in zip(fused, oracle, strict=True):
        assert f.shape == o.shape
        np.testing.assert_array_equal(np.asarray(f).view(np.uint32), np.asarray(o).view(np.uint32))


def supports(kind: str, world: int, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each worker's nonzero positions: disjoint, identical, overlapping or all."""
    if kind == "all":
        return [np.arange(n)] * world
    if kind == "identical":
        return [rng.choice(n, n // 20, replace=False)] * world
    if kind == "disjoint":
        return list(np.array_split(rng.permutation(n)[: n // 10], world))
    return [rng.choice(n, n // 20, replace=False) for _ in range(world)]


def values(kind: str, size: int, world: int, rng: np.random.Generator) -> np.ndarray:
    """Nonzero float32 values of one worker: ordinary, at float32's edges, or 80 decades."""
    if kind == "edges":
        edges = [F32.max / world, -F32.max / world, TINY, -TINY, 1 - 2.0**-24, F32.tiny, -1.0]
        return np.resize(np.array(edges, np.float32), size)
    if kind == "decades":
        # finite, and so are the sums of 7 workers: |normal| < ~6, times at most 1e36
        return (rng.standard_normal(size) * 10.0 ** rng.uniform(-40, 36, size)).astype(np.float32)
    return rng.standard_normal(size).astype(np.float32)


@pytest.mark.parametrize("world", [1, 2, 4, 7])
@pytest.mark.parametrize("support", ["disjoint", "identical", "overlapping", "all"])
@pytest.mark.parametrize("kind", ["normal", "edges", "decades"])
def test_flat_sums_equal_the_oracle_bit_for_bit(world, support, kind):
    rng = np.random.default_rng(zlib.crc32(f"{world} {support} {kind}".encode()))  # stable
    n = 5000
    xs = []
    for idx in supports(support, world, n, rng):
        x = np.zeros(n, np.float32)
        x[idx] = values(kind, idx.size, world, rng)
        xs.append(x)
    for options in ({}, {"values": "sketch"}, {"index_levels": 2}, {"support_block": 7}):
        fused, flog, oracle, olog = both(world, xs, exp_block=1000, **options)
        assert_same(fused, oracle)
        assert [p.op for p in olog] == [Op.MAX, *(p.op for p in flog)]


@pytest.mark.parametrize("values_mode", ["ranked", "sketch"])
def test_rows_sums_equal_the_oracle_bit_for_bit(values_mode):
    rng = np.random.default_rng(5)
    world, nrows, width = 4, 3000, 8
    cases = {
        "disjoint": [np.arange(r, nrows, world) for r in range(world)],
        "identical": [np.arange(0, nrows, 3)] * world,
        "one rank only": [np.arange(10), *([np.zeros(0, np.int64)] * (world - 1))],
    }
    for name, rows in cases.items():
        xs = [SparseRows(r, values("edges", r.size * width, world, rng).reshape(-1, width), nrows)
              for r in rows]  # fmt: skip
        outs = []
        for e in ("or", "max"):
            log: list = []
            gens = [LosslessSparse(world, exponents=e, values=values_mode).aggregate_rows(x)
                    for x in xs]  # fmt: skip
            outs.append((drive(gens, phases_log=log), len(log)))
        (fused, nf), (oracle, no) = outs
        assert nf == no - 1, name
        for f, o in zip(fused, oracle, strict=True):
            np.testing.assert_array_equal(f.rows, o.rows)
            np.testing.assert_array_equal(f.values.view(np.uint32), o.values.view(np.uint32))


def test_empty_and_all_zero_buckets():
    for n in (0, 1, 40_000):
        xs = [np.zeros(n, np.float32)] * 3
        fused, flog, oracle, olog = both(3, xs)
        assert_same(fused, oracle)
        assert len(flog) == max(0, len(olog) - 1) <= 1  # an empty union: no value phase


def test_non_finite_input_raises_on_every_worker_alike():
    xs = [np.zeros(100, np.float32), np.zeros(100, np.float32)]
    xs[1][7] = np.inf
    for e in ("or", "max"):
        with pytest.raises(NonFiniteError):
            simulate([LosslessSparse(2, exponents=e) for _ in xs], xs)
    with pytest.raises(ValueError, match="exponents must be one of"):
        LosslessSparse(2, exponents="sum")


def test_exponent_bits_or_to_the_max():
    rng = np.random.default_rng(9)
    pool = np.array([EXP_ZERO, -149, -148, -1, 0, 1, 31, 32, 127, 128, EXP_NONFINITE], np.int32)
    for _ in range(100):
        exps = [rng.choice(pool, 40) for _ in range(5)]
        ored = np.bitwise_or.reduce([exponents_as_bits(e) for e in exps])
        np.testing.assert_array_equal(exponents_from_bits(ored, 40), np.max(exps, axis=0))
