"""Fixed-point codec: exponent agreement, the error bound, no overflow at the extremes,
lane packing for low precision, non-finite input."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import FixedPoint, NonFiniteError, SparseGrad, simulate
from homagg.worker.codecs.exponent import (
    EXP_ZERO,
    dense_exponents,
    headroom_bits,
    num_blocks,
    quantize,
    sparse_exponents,
)

INT32_MAX = 2**31 - 1


def agreed_exponents(xs: list[np.ndarray], block: int) -> np.ndarray:
    return np.max([dense_exponents(x.reshape(-1), block) for x in xs], axis=0)


def assert_within_bound(decoded: np.ndarray, xs: list[np.ndarray], block: int, bits: int = 32):
    """|decoded - sum| <= W * 2^(E-P) * (1/2 for 32 bits, 1 with clipping lanes)
    + half an ulp of the float32 output."""
    world = len(xs)
    p = headroom_bits(world, bits)
    exps = agreed_exponents(xs, block)
    n = decoded.size
    e = np.repeat(exps, block)[:n].astype(np.float64)
    quantum = np.where(e == EXP_ZERO, 0.0, np.ldexp(1.0, (e - p).astype(np.int64)))
    per_worker = 0.5 if bits == 32 else 1.0
    true = np.sum([x.reshape(-1).astype(np.float64) for x in xs], axis=0)
    out = decoded.reshape(-1).astype(np.float64)
    e32 = np.frexp(out)[1]
    half_ulp = np.ldexp(1.0, np.maximum(e32 - 24, -149)) / 2  # of the float32 output
    bound = world * per_worker * quantum + half_ulp
    assert np.all(np.abs(out - true) <= bound), np.max(np.abs(out - true) - bound)


def test_headroom_never_overflows():
    for world in range(1, 129):
        p = headroom_bits(world)
        assert world * (2**p - 1) <= INT32_MAX
        assert world * 2 ** (p + 1) > INT32_MAX  # and no bit is wasted
    for bits in (4, 8, 16):
        for world in range(1, 5 if bits == 4 else 33):
            p = headroom_bits(world, bits)
            assert world * (2 ** (p + 1) - 1) < 2**bits
    with pytest.raises(ValueError):
        headroom_bits(5, 4)


def test_exponent_phase_is_the_max_of_block_exponents():
    rng = np.random.default_rng(1)
    xs = [
        (rng.standard_normal(1000) * 10.0 ** rng.uniform(-3, 3, 1000)).astype(np.float32)
        for _ in range(3)
    ]
    xs[1][:100] = 0  # an all-zero block on one worker only
    log = []
    simulate([FixedPoint(3, block=100) for _ in xs], xs, phases_log=log)
    assert [ph.op for ph in log] == [Op.MAX, Op.ADD]
    assert log[0].cells.size == 10 and log[1].cells.size == 1000 + 1  # + the status cell
    own = [dense_exponents(x, 100) for x in xs]
    assert np.array_equal(own[1][0], EXP_ZERO)
    for x, e in zip(xs, own):  # |x| < 2^E, and 2^(E-1) <= max|x|
        blocks = np.abs(x).reshape(10, 100).max(axis=1)
        ok = e != EXP_ZERO
        assert np.all(blocks[ok] < np.ldexp(1.0, e[ok]))
        assert np.all(blocks[ok] >= np.ldexp(1.0, e[ok] - 1))


def test_sparse_and_dense_exponents_agree():
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(1, 3000))
        x = np.zeros(n, np.float32)
        nz = rng.random(n) < rng.uniform(0, 0.3)
        x[nz] = rng.standard_normal(nz.sum()) * 10.0 ** rng.uniform(-40, 38)
        idx = np.flatnonzero(x)
        block = int(rng.integers(1, 500))
        assert np.array_equal(dense_exponents(x, block), sparse_exponents(idx, x[idx], n, block))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 32])
def test_error_bound_random_and_adversarial(world):
    rng = np.random.default_rng(world)
    cases = []
    for _ in range(40):
        n = int(rng.integers(1, 700))
        cases.append(
            [
                (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6)).astype(np.float32)
                for _ in range(world)
            ]
        )
    n = 300
    huge = [np.full(n, 1e-3, np.float32) for _ in range(world)]
    huge[0][7] = 3e35  # one huge element dominates its block
    cases.append(huge)
    cases.append([np.full(n, 0.3, np.float32) for _ in range(world)])  # all equal
    cases.append([-np.abs(rng.standard_normal(n)).astype(np.float32) for _ in range(world)])
    cases.append([np.full(n, -(2.0**20), np.float32) for _ in range(world)])  # powers of two
    tiny = [np.full(n, 1e-45, np.float32) * rng.integers(-9, 9, n) for _ in range(world)]
    cases.append(tiny)  # denormals
    mixed = [
        (rng.standard_normal(n) * 10.0 ** rng.uniform(-44, 37, n)).astype(np.float32)
        for _ in range(world)
    ]
    cases.append(mixed)
    for xs in cases:
        for block in (64, 16384):
            out = simulate([FixedPoint(world, block=block) for _ in xs], xs)
            for o in out[1:]:
                assert np.array_equal(o.view(np.int32), out[0].view(np.int32))
            assert_within_bound(out[0], xs, block)


def test_denormals_and_zero_are_exact():
    a = np.array([1e-45, 3e-45, 0.0, -2e-45], np.float32)
    b = np.array([2e-45, -3e-45, 0.0, 1e-44], np.float32)
    out = simulate([FixedPoint(2), FixedPoint(2)], [a, b])[0]
    assert np.array_equal(out, a.astype(np.float64) + b)
    zero = [np.zeros((3, 5), np.float32)] * 4
    out = simulate([FixedPoint(4) for _ in range(4)], zero)
    assert out[0].shape == (3, 5) and not np.any(out[0])


@pytest.mark.parametrize("world", [1, 3, 4, 32])
def test_no_overflow_at_extreme_magnitudes(world):
    below_one = np.float32(1.0 - 2.0**-24)  # the largest float32 below 2^0: q = 2^P - 1
    for sign in (1, -1):
        xs = [np.full(100, sign * below_one, np.float32) for _ in range(world)]
        out = simulate([FixedPoint(world) for _ in range(world)], xs)[0]
        assert np.all(np.sign(out) == sign)
        assert_within_bound(out, xs, 16384)
    big = np.float32(np.finfo(np.float32).max)
    xs = [np.full(10, big / world, np.float32) for _ in range(world)]
    out = simulate([FixedPoint(world) for _ in range(world)], xs)[0]
    assert np.all(np.isfinite(out)) and np.all(out > 0)
    assert_within_bound(out, xs, 16384)


def test_quantized_values_stay_within_headroom():
    rng = np.random.default_rng(5)
    for world in (2, 5, 32):
        p = headroom_bits(world)
        x = (rng.standard_normal(10000) * 10.0 ** rng.uniform(-30, 30, 10000)).astype(np.float32)
        e = np.frexp(np.abs(x))[1]
        q = quantize(x, p - e, p)
        assert np.all(np.abs(q.astype(np.int64)) <= 2**p - 1)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_raises_on_every_worker(bad):
    xs = [np.ones(50, np.float32) for _ in range(3)]
    xs[2][17] = bad
    with pytest.raises(NonFiniteError):  # simulate re-raises only if *every* worker raised
        simulate([FixedPoint(3) for _ in range(3)], xs)


def test_per_tensor_exponent_and_sparse_input():
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(5000).astype(np.float32) for _ in range(4)]
    log = []
    out = simulate([FixedPoint(4, block=None) for _ in range(4)], xs, phases_log=log)[0]
    assert log[0].cells.size == 1
    assert_within_bound(out, xs, 5000)
    sparse = [SparseGrad(np.flatnonzero(x)[::-1], x[np.flatnonzero(x)][::-1], x.size) for x in xs]
    again = simulate([FixedPoint(4, block=None) for _ in range(4)], sparse)[0]
    assert np.array_equal(again, out)


@pytest.mark.parametrize("bits,world", [(8, 4), (16, 3), (4, 2), (2, 1)])
def test_low_precision_lanes_never_carry(bits, world):
    rng = np.random.default_rng(bits)
    n = 1001  # not a multiple of the lanes per cell
    xs = [(rng.standard_normal(n) * 100).astype(np.float32) for _ in range(world)]
    xs[0][3] = 1.0 - 2.0**-20  # rounds to 2^P: clipped to 2^P - 1
    log = []
    out = simulate([FixedPoint(world, bits=bits, block=128) for _ in xs], xs, phases_log=log)
    assert log[1].cells.size == -(-n // (32 // bits)) + 1
    p = headroom_bits(world, bits)
    exps = agreed_exponents(xs, 128)
    shift = np.repeat(p - exps, 128)[:n]
    qsum = np.sum([quantize(x, shift, p).astype(np.int64) for x in xs], axis=0)
    assert np.array_equal(out[0], np.ldexp(qsum.astype(np.float64), -shift).astype(np.float32))
    assert_within_bound(out[0], xs, 128, bits=bits)


def test_num_blocks():
    assert num_blocks(0, 64) == 1 and num_blocks(64, 64) == 1 and num_blocks(65, 64) == 2


def test_corrupted_huge_exponent_is_corrupt_not_non_finite():
    from homagg.wire.constants import Op
    from homagg.worker.codecs import CorruptResultError
    from homagg.worker.codecs.exponent import EXP_NONFINITE

    xs = [np.ones(50, np.float32) for _ in range(3)]
    for corrupt in (EXP_NONFINITE + 1, 2**31 - 1, 5000):

        def tamper(step, phase, combined, corrupt=corrupt):
            return np.full_like(combined, corrupt) if phase.op == Op.MAX else combined

        with pytest.raises(CorruptResultError, match="impossible exponents"):
            simulate([FixedPoint(3) for _ in range(3)], xs, tamper=tamper)
