"""The lossless codec's per-block paths against their per-element definitions, bit for bit:
quantize_at / dequantize_at (a power of two a block, gathered), sparse_exponents on sorted
and unsorted nonzeros, the fingerprint's 32-bit sums against its 64-bit definition, and the
ranks in a dense union (a table) against binary search."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.worker.codecs.count_sketch import _FINGERPRINT_SEED, fingerprint, mix64
from homagg.worker.codecs.exponent import (
    EXP_ZERO,
    decode_shifts,
    dense_exponents,
    dequantize,
    dequantize_at,
    quantize,
    quantize_at,
    sparse_exponents,
)
from homagg.worker.codecs.lossless import _ranks

pytestmark = pytest.mark.unit


def _exps(rng: np.random.Generator, blocks: int) -> np.ndarray:
    """Agreed exponents: ordinary, tiny (P - E > 126), huge, and all-zero blocks."""
    e = rng.choice([-149, -140, -100, -20, 0, 5, 60, 127, 128], size=blocks).astype(np.int32)
    e[rng.random(blocks) < 0.2] = EXP_ZERO
    return e


@pytest.mark.parametrize("p", [29, 30, 20])
def test_quantize_at_is_quantize_of_the_gathered_shifts(p: int) -> None:
    rng = np.random.default_rng(p)
    for _ in range(50):
        exps = _exps(rng, int(rng.integers(1, 9)))
        live = np.flatnonzero(exps != EXP_ZERO)
        if not live.size:
            continue
        blocks = np.sort(rng.choice(live, int(rng.integers(1, 300))))
        # values below each block's bound 2^E, down to subnormals
        mags = np.ldexp(rng.random(blocks.size), exps[blocks].astype(np.int64))
        vals = (mags * rng.choice([-1, 1], blocks.size)).astype(np.float32)
        want = quantize(vals, p - np.take(exps, blocks), p)
        assert np.array_equal(quantize_at(vals, exps, blocks, p), want)


def test_dequantize_at_is_dequantize_of_the_gathered_shifts() -> None:
    rng = np.random.default_rng(1)
    for p in (29, 30):
        for _ in range(50):
            exps = _exps(rng, int(rng.integers(1, 9)))
            shifts = decode_shifts(exps, p)
            blocks = np.sort(rng.integers(0, exps.size, int(rng.integers(0, 300))))
            sums = rng.integers(-(2**31), 2**31, blocks.size, dtype=np.int64).astype(np.int32)
            with np.errstate(over="ignore"):  # 2^128-scale blocks overflow alike
                want = dequantize(sums, np.take(shifts, blocks))
                got = dequantize_at(sums, shifts, blocks)
            # the subnormal results (shifts below -126) included
            assert got.dtype == np.float32 and np.array_equal(
                got.view(np.int32), want.view(np.int32)
            )


def test_sparse_exponents_sorted_unsorted_and_dense_agree() -> None:
    rng = np.random.default_rng(2)
    for n, block in ((1, 4), (100, 7), (5000, 64), (70000, 16384)):
        x = np.zeros(n, np.float32)
        nz = rng.choice(n, max(1, n // 5), replace=False)
        x[nz] = (rng.standard_normal(nz.size) * 10.0 ** rng.integers(-40, 38, nz.size)).astype(
            np.float32
        )
        if n > 50:  # a non-finite block's marker, from an inf and from a NaN
            x[nz[0]], x[nz[-1]] = np.inf, np.nan
        idx = np.flatnonzero(x)
        want = dense_exponents(x, block)
        assert np.array_equal(sparse_exponents(idx, x[idx], n, block), want)
        shuffled = rng.permutation(idx.size)  # another caller's order: ufunc.at's path
        assert np.array_equal(sparse_exponents(idx[shuffled], x[idx][shuffled], n, block), want)


def _fingerprint_64(elements: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The fingerprint's definition: 64-bit products of odd-halved hashes, summed mod 2^64,
    each half's low 32 bits."""
    c = mix64(elements, _FINGERPRINT_SEED) | np.uint64(0x0000000100000001)
    qu = q.astype(np.int64).astype(np.uint64)
    lo = np.sum((c & np.uint64(0xFFFFFFFF)) * qu, dtype=np.uint64)
    hi = np.sum((c >> np.uint64(32)) * qu, dtype=np.uint64)
    return np.array([lo, hi], dtype=np.uint64).astype(np.uint32).view(np.int32)


def test_fingerprint_equals_its_64_bit_definition() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 17, 1000, 50000):
        elements = np.sort(rng.choice(2**40, n, replace=False)).astype(np.int64)
        q = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
        q[:1] = np.iinfo(np.int32).min  # the 32-bit edges
        q[-1:] = np.iinfo(np.int32).max
        assert np.array_equal(fingerprint(elements, q), _fingerprint_64(elements, q))
    assert np.array_equal(fingerprint(np.zeros(0, np.int64), np.zeros(0, np.int32)), [0, 0])


@pytest.mark.parametrize("density", [0.001, 0.05, 0.2, 1.0])
def test_ranks_in_a_dense_union_match_binary_search(density: float) -> None:
    rng = np.random.default_rng(4)
    nkeys = 20000
    union = np.flatnonzero(rng.random(nkeys) < density).astype(np.int64)
    if not union.size:
        union = np.array([7], np.int64)
    # this worker's keys: most in the union, a few not (a corrupt union: the caller checks)
    keys = np.unique(np.r_[rng.choice(union, min(union.size, 500)), rng.integers(0, nkeys, 20)])
    got = _ranks(union, keys, nkeys)
    want = np.minimum(np.searchsorted(union, keys), union.size - 1)
    there = np.take(union, want) == keys
    assert np.array_equal(np.take(union, got) == keys, there)
    assert np.array_equal(got[there], want[there])
