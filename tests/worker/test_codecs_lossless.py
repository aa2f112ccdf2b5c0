"""Lossless sparse codec: bit-exact agreement with the dense fixed-point sum over thousands
of random cases, the phase structure, peeling retries, corruption detection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import (
    CorruptResultError,
    FixedPoint,
    LosslessSparse,
    PeelingError,
    SparseGrad,
    simulate,
)
from homagg.worker.codecs.count_sketch import (
    FINGERPRINT_CELLS,
    SketchShape,
    encode,
    plan_peeling,
)
from homagg.worker.codecs.exponent import DEFAULT_BLOCK, EXP_BIT_WORDS, headroom_bits, num_blocks
from homagg.worker.codecs.lossless import sketch_rows


def random_inputs(rng: np.random.Generator, world: int, n: int) -> list[np.ndarray]:
    """Sparse float32 gradients with a random support pattern and value distribution."""
    density = math.exp(rng.uniform(math.log(0.001), math.log(0.2)))
    pattern = rng.choice(["independent", "overlapping", "disjoint", "single", "zero", "rows"])
    masks = []
    if pattern == "independent":
        masks = [rng.random(n) < density for _ in range(world)]
    elif pattern == "overlapping":
        shared = rng.random(n) < density
        masks = [shared | (rng.random(n) < density / 4) for _ in range(world)]
    elif pattern == "disjoint":
        owner = rng.integers(0, world, n)
        chosen = rng.random(n) < density * world
        masks = [chosen & (owner == w) for w in range(world)]
    elif pattern == "single":
        masks = [np.zeros(n, bool) for _ in range(world)]
        masks[int(rng.integers(world))][int(rng.integers(n))] = True
    elif pattern == "zero":
        masks = [np.zeros(n, bool) for _ in range(world)]
    else:  # row-sparse, like an embedding gradient
        d = int(rng.integers(2, 17))
        rows = rng.random(-(-n // d)) < density * 4
        masks = [np.repeat(rows & (rng.random(rows.size) < 0.7), d)[:n] for _ in range(world)]
    values = rng.choice(["normal", "equal", "negative", "wide", "integers"])
    xs = []
    for mask in masks:
        x = np.zeros(n, np.float32)
        k = int(mask.sum())
        if values == "normal":
            v = rng.standard_normal(k) * 10.0 ** rng.uniform(-8, 8)
        elif values == "equal":
            v = np.full(k, rng.standard_normal())
        elif values == "negative":
            v = -np.abs(rng.standard_normal(k))
        elif values == "wide":
            v = rng.standard_normal(k) * 10.0 ** rng.uniform(-30, 30, k)
        else:
            v = rng.integers(-3, 4, k).astype(np.float64)  # duplicates, and explicit zeros
        x[mask] = v
        xs.append(x)
    return xs


def assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    assert np.array_equal(a.view(np.int32), b.view(np.int32))


@pytest.mark.slow
def test_bit_exact_against_dense_fixed_point_sweep():
    rng = np.random.default_rng(2024)
    cases = 0
    for trial in range(2000):
        world = (2, 4, 8)[trial % 3]
        n = int(rng.integers(1, 2500))
        xs = random_inputs(rng, world, n)
        exp_block = int(rng.choice([64, 1000, 16384]))
        dense = simulate([FixedPoint(world, block=exp_block) for _ in xs], xs)[0]
        support = int(rng.choice([1, 1, 1, 5, 16]))
        mode = "ranked" if trial % 5 == 0 else "sketch"
        codecs = [
            LosslessSparse(world, support_block=support, exp_block=exp_block, values=mode)
            for _ in xs
        ]
        for out in simulate(codecs, xs):
            assert_same_bits(out, dense)
        true = np.sum(np.array(xs, np.float64), axis=0)
        scale = np.max(np.abs(np.array(xs)), initial=0.0)
        assert np.all(
            np.abs(dense - true)
            <= world * scale * 2.0 ** (1 - headroom_bits(world)) + np.abs(true) * 2.0**-23
        )
        cases += 1
    assert cases == 2000


def test_large_tensor_is_exact():
    rng = np.random.default_rng(7)
    n, world = 2_000_000, 4
    xs = []
    for _ in range(world):
        x = np.zeros(n, np.float32)
        idx = rng.choice(n, n // 100, replace=False)
        x[idx] = rng.standard_normal(idx.size)
        xs.append(x)
    dense = simulate([FixedPoint(world) for _ in xs], xs)[0]
    out = simulate([LosslessSparse(world) for _ in xs], xs)
    for o in out:
        assert_same_bits(o, dense)


def test_phases_and_lengths():
    rng = np.random.default_rng(3)
    n, world = 10_000, 3
    xs = random_inputs(rng, world, n)
    xs[0][5] = 1.0  # a non-empty union
    log = []
    codecs = [LosslessSparse(world, exp_block=1000, values="sketch") for _ in xs]
    simulate(codecs, xs, phases_log=log)
    union = np.flatnonzero(np.any(np.array(xs) != 0, axis=0))
    rows = sketch_rows(union.size, codecs[0].last_attempts - 1)
    # the 10 blocks' exponents ride the OR phase, EXP_BIT_WORDS each
    assert [p.op for p in log] == [Op.OR, Op.ADD]
    index = math.ceil(n / 32) + 1
    # and a witness cell per block in the value phase ("my exponent is the agreed one")
    assert [p.cells.size for p in log] == [
        10 * EXP_BIT_WORDS + index,
        rows + 10 + FINGERPRINT_CELLS,
    ]
    log = []
    simulate([LosslessSparse(world) for _ in xs], xs, phases_log=log)  # the default: ranked
    assert [p.cells.size for p in log] == [
        EXP_BIT_WORDS + index,
        union.size + 1 + FINGERPRINT_CELLS,
    ]
    log = []
    simulate([LosslessSparse(world, exponents="max") for _ in xs], xs, phases_log=log)
    assert [p.op for p in log] == [Op.MAX, Op.OR, Op.ADD]
    assert [p.cells.size for p in log] == [1, index, union.size + FINGERPRINT_CELLS]


def test_block_granular_support_row_sparse():
    rng = np.random.default_rng(4)
    rows, dim, world = 1000, 37, 4  # n = 37000; sketch keys are rows
    xs = []
    for _ in range(world):
        x = np.zeros((rows, dim), np.float32)
        touched = rng.choice(rows, 20, replace=False)
        x[touched] = rng.standard_normal((20, dim))
        x[touched[0], 3] = 0  # a zero inside a nonzero row
        xs.append(x)
    log = []
    dense = simulate([FixedPoint(world) for _ in xs], xs)[0]
    out = simulate([LosslessSparse(world, support_block=dim) for _ in xs], xs, phases_log=log)
    assert out[0].shape == (rows, dim)
    assert_same_bits(out[0], dense)
    union_rows = np.flatnonzero(np.any(np.array(xs) != 0, axis=(0, 2))).size
    exps = EXP_BIT_WORDS * num_blocks(rows * dim, DEFAULT_BLOCK)
    assert log[0].cells.size == exps + math.ceil(rows / 32) + 1  # + the status word
    witness = num_blocks(rows * dim, DEFAULT_BLOCK)
    assert (log[1].cells.size - witness) % dim == FINGERPRINT_CELLS
    assert (log[1].cells.size - witness - FINGERPRINT_CELLS) // dim < 1.5 * union_rows + 20
    # a partial last block: n is not a multiple of the support block
    flat = [x.reshape(-1)[:-5] for x in xs]
    dense = simulate([FixedPoint(world) for _ in flat], flat)[0]
    assert_same_bits(
        simulate([LosslessSparse(world, support_block=dim) for _ in flat], flat)[0], dense
    )


def test_sparse_triple_input_matches_dense():
    rng = np.random.default_rng(5)
    world, n = 4, 5000
    xs = random_inputs(rng, world, n)
    xs[1][10] = 2.5
    triples = []
    for x in xs:
        idx = np.flatnonzero(x)
        perm = rng.permutation(idx.size)
        # unsorted, with one index split into two duplicate halves
        idx, vals = np.r_[idx[perm], idx[:1]], np.r_[x[idx][perm], np.float32(0)]
        if idx.size > 1:
            vals[-1] = vals[np.flatnonzero(idx[:-1] == idx[-1])[0]] / 2
            vals[np.flatnonzero(idx[:-1] == idx[-1])[0]] /= 2
        triples.append(SparseGrad(idx, vals, n))
    a = simulate([LosslessSparse(world) for _ in xs], xs)[0]
    b = simulate([LosslessSparse(world) for _ in xs], triples)[0]
    assert_same_bits(a, b)


def test_forced_peeling_failure_is_retried_exactly():
    rng = np.random.default_rng(6)
    world, n = 4, 20_000
    xs = random_inputs(rng, world, n)
    for x in xs:
        x[rng.choice(n, 500, replace=False)] = rng.standard_normal(500)
    dense = simulate([FixedPoint(world) for _ in xs], xs)[0]
    # factor 0.4: loads 2.5, 1.67, 1.11 cannot peel (two seeds each); 0.74 (attempt 6) does
    codecs = [
        LosslessSparse(world, factor=0.4, margin=0, extra=0, max_attempts=8, values="sketch")
        for _ in xs
    ]
    log = []
    for out in simulate(codecs, xs, phases_log=log):
        assert_same_bits(out, dense)
    assert all(c.last_attempts == codecs[0].last_attempts >= 7 for c in codecs)
    assert sum(p.op == Op.ADD for p in log) == 1  # retries cost no extra phase
    with pytest.raises(PeelingError):  # every worker gives up identically
        simulate(
            [LosslessSparse(world, factor=0.4, max_attempts=2, values="sketch") for _ in xs], xs
        )


def test_peeling_success_threshold():
    rng = np.random.default_rng(8)
    keys = np.sort(rng.choice(10**6, 3000, replace=False))
    ok_low = sum(
        plan_peeling(keys, SketchShape(3 * math.ceil(3000 / 0.7 / 3), 1, s)) is not None
        for s in range(20)
    )
    ok_high = sum(
        plan_peeling(keys, SketchShape(3 * math.ceil(3000 / 0.95 / 3), 1, s)) is not None
        for s in range(20)
    )
    assert ok_low == 20 and ok_high == 0


@pytest.mark.parametrize("mode", ["sketch", "ranked"])
def test_corrupted_value_phase_is_detected_never_wrong(mode):
    rng = np.random.default_rng(9)
    world, n = 3, 3000
    xs = random_inputs(rng, world, n)
    for x in xs:
        x[rng.choice(n, 60, replace=False)] = rng.standard_normal(60)
    expected = simulate([LosslessSparse(world, values=mode) for _ in xs], xs)[0]
    cells = None

    def flip(position: int, bit: int):
        def tamper(step, phase, combined):
            nonlocal cells
            if phase.op == Op.ADD:
                cells = combined.size
                combined = combined.copy()
                combined.view(np.uint32)[position % combined.size] ^= np.uint32(1 << bit)
            return combined

        return tamper

    detected = 0
    for _trial in range(300):
        position, bit = int(rng.integers(1 << 30)), int(rng.integers(32))
        try:
            out = simulate(
                [LosslessSparse(world, values=mode) for _ in xs], xs, tamper=flip(position, bit)
            )
        except CorruptResultError:
            detected += 1
            continue
        assert_same_bits(out[0], expected)  # never a wrong sum
    assert detected == 300
    assert cells is not None

    def add_noise(step, phase, combined):  # many cells at once
        if phase.op == Op.ADD:
            combined = combined + rng.integers(-5, 5, combined.size).astype(np.int32)
        return combined

    with pytest.raises(CorruptResultError):
        simulate([LosslessSparse(world, values=mode) for _ in xs], xs, tamper=add_noise)


def test_corrupted_bitmap_and_exponents():
    world, n = 2, 4001
    xs = [np.zeros(n, np.float32) for _ in range(world)]
    xs[0][[3, 100, 2000]] = [1.0, -2.0, 3.0]
    xs[1][[100, 3999]] = [0.5, 7.0]
    expected = simulate([LosslessSparse(world) for _ in xs], xs)[0]

    def tamper_or(change):
        return lambda step, phase, c: change(c.copy()) if phase.op == Op.OR else c

    at = EXP_BIT_WORDS  # the bitmap follows the one block's exponent bits

    def add_bit(c):
        c.view(np.uint32)[at + 10] |= np.uint32(1 << 7)
        return c

    def drop_bit(c):
        c.view(np.uint32)[at + 100 // 32] &= ~np.uint32(1 << (100 % 32))
        return c

    def beyond_end(c):
        c.view(np.uint32)[-2] |= np.uint32(1 << 31)  # the bitmap's last word (then status)
        return c

    def status_fault(c):
        c[-1] |= 1
        return c

    # an extra position decodes to an exact zero; a lost one is detected
    for mode in ("sketch", "ranked"):
        assert_same_bits(
            simulate(
                [LosslessSparse(world, values=mode) for _ in xs], xs, tamper=tamper_or(add_bit)
            )[0],
            expected,
        )
        for change in (drop_bit, beyond_end, status_fault):
            with pytest.raises(CorruptResultError):
                simulate(
                    [LosslessSparse(world, values=mode) for _ in xs], xs, tamper=tamper_or(change)
                )

    def clear_all(c):
        c[:] = 0
        return c

    with pytest.raises(CorruptResultError, match="union support is empty"):
        simulate([LosslessSparse(world) for _ in xs], xs, tamper=tamper_or(clear_all))
    zero = [np.zeros(n, np.float32)] * world
    log = []
    out = simulate([LosslessSparse(world) for _ in xs], zero, phases_log=log)
    assert len(log) == 1 and not np.any(out[0])  # an empty union needs no value phase

    def lower_exponents(step, phase, c):
        return c - 1 if phase.op == Op.MAX else c

    # only worker 1 can see it (its 7.0 sets the maximum); its status word stops everyone
    with pytest.raises(CorruptResultError, match="below its own"):
        codecs = [LosslessSparse(world, exponents="max") for _ in xs]
        simulate(codecs, xs, tamper=lower_exponents)

    def clear_top_exponent_bit(step, phase, c):
        if step:
            return c
        c = c.copy()
        bits = c[: EXP_BIT_WORDS * num_blocks(n, DEFAULT_BLOCK)].view(np.uint32)
        top = np.flatnonzero(bits)[-1]
        bits[top] &= ~np.uint32(1 << (int(bits[top]).bit_length() - 1))
        return c

    # the same fault with the exponents in the OR phase: worker 1 marks its fingerprint
    with pytest.raises(CorruptResultError, match="exceeds the agreed"):
        simulate([LosslessSparse(world) for _ in xs], xs, tamper=clear_top_exponent_bit)


def test_wrapping_sketch_cells_still_decode():
    # every element at the top of the range: bucket sums wrap modulo 2^32, peeling does not care
    world, n = 8, 4096
    top = np.float32(1.0 - 2.0**-24)
    xs = [np.where(np.arange(n) % 3 == 0, top, 0).astype(np.float32) for _ in range(world)]
    shape = SketchShape(sketch_rows(n // 3 + 1, 0), 1, 0)
    keys = np.flatnonzero(xs[0]).astype(np.int64)
    q = np.full(keys.size, 2 ** headroom_bits(world) - 1, np.int32)
    assert np.any(
        encode(keys, keys * 0, q, shape) * world
        != encode(keys, keys * 0, q, shape).astype(np.int64) * world
    )
    dense = simulate([FixedPoint(world) for _ in xs], xs)[0]
    assert_same_bits(simulate([LosslessSparse(world, values="sketch") for _ in xs], xs)[0], dense)


@pytest.mark.parametrize("mode", ["sketch", "ranked"])
def test_reused_codecs_stay_exact_step_after_step(mode):
    # the output buffer is reused and cleared only where the last step wrote
    rng = np.random.default_rng(12)
    world = 3
    codecs = [LosslessSparse(world, values=mode) for _ in range(world)]
    for step, n in enumerate((5000, 5000, 5000, 7000, 7000)):
        xs = random_inputs(rng, world, n)
        for x in xs:
            x[rng.choice(n, 40 * (step + 1), replace=False)] = rng.standard_normal(40 * (step + 1))
        if step == 2:  # a failed step in between leaves no trace in the next one
            with pytest.raises(CorruptResultError):
                simulate(codecs, xs, tamper=lambda s, phase, c: c + 1 if phase.op == Op.ADD else c)
        dense = simulate([FixedPoint(world) for _ in xs], xs)[0]
        outs = simulate(codecs, xs)
        for out in outs:
            assert_same_bits(out, dense)
            assert not out.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            outs[0][0] = 1.0


def _sparse(rng, world: int, n: int, k: int) -> list[np.ndarray]:
    xs = [np.zeros(n, np.float32) for _ in range(world)]
    for x in xs:
        x[rng.choice(n, k, replace=False)] = rng.standard_normal(k)
    return xs


@pytest.mark.parametrize("mode", ["sketch", "ranked"])
def test_two_level_index_is_exact_and_sends_only_chosen_words(mode):
    rng = np.random.default_rng(13)
    world, n = 4, 200_000  # 6,250 bitmap words: two levels by default
    xs = _sparse(rng, world, n, 100)
    dense = simulate([FixedPoint(world) for _ in xs], xs)[0]
    log = []
    out = simulate([LosslessSparse(world, values=mode) for _ in xs], xs, phases_log=log)
    assert_same_bits(out[0], dense)
    union = np.flatnonzero(np.any(np.array(xs) != 0, axis=0))
    words = np.unique(union // 32)
    exps = EXP_BIT_WORDS * num_blocks(n, DEFAULT_BLOCK)
    assert [p.op for p in log] == [Op.OR, Op.OR, Op.ADD]
    assert log[0].cells.size == exps + math.ceil(math.ceil(n / 32) / 32) + 1  # a bit per word
    assert log[1].cells.size == words.size
    one = []
    assert_same_bits(
        simulate(
            [LosslessSparse(world, values=mode, index_levels=1) for _ in xs], xs, phases_log=one
        )[0],
        dense,
    )
    assert [p.op for p in one] == [Op.OR, Op.ADD]
    assert one[0].cells.size == exps + math.ceil(n / 32) + 1
    # all zero: the first level ends the step
    log = []
    zero = simulate(
        [LosslessSparse(world) for _ in xs], [np.zeros(n, np.float32)] * world, phases_log=log
    )
    assert len(log) == 1 and not np.any(zero[0])


def test_two_level_index_corruption_is_detected():
    rng = np.random.default_rng(14)
    world, n = 3, 100_000
    xs = _sparse(rng, world, n, 50)
    # the index's words alone in the OR phases (the exponents in a MAX phase of their own)
    expected = simulate([LosslessSparse(world, exponents="max") for _ in xs], xs)[0]

    def on_phase(number, change):
        seen = {"or": 0}

        def tamper(step, phase, c):
            if phase.op == Op.OR:
                seen["or"] += 1
                if seen["or"] == number:
                    return change(c.copy())
            return c

        return tamper

    def set_lowest_clear_bit(c, w):
        v = c.view(np.uint32)[w]
        c.view(np.uint32)[w] = v | (~v & (v + np.uint32(1)))
        return c

    def extra_word(c):  # the top level names a word nobody set
        return set_lowest_clear_bit(c, np.flatnonzero(c[:-1] != -1)[0])

    def drop_word(c):  # a word somebody set is left out
        c[np.flatnonzero(c[:-1])[0]] = 0
        return c

    def zero_a_word(c):
        c[0] = 0
        return c

    def drop_bit(c):
        w = np.flatnonzero(c)[0]
        c.view(np.uint32)[w] &= c.view(np.uint32)[w] - np.uint32(1)  # clear the lowest set bit
        return c

    def add_bit(c):
        return set_lowest_clear_bit(c, np.flatnonzero(c != -1)[0])

    for number, change in ((1, extra_word), (1, drop_word), (2, zero_a_word), (2, drop_bit)):
        with pytest.raises(CorruptResultError):
            simulate(
                [LosslessSparse(world, exponents="max") for _ in xs],
                xs,
                tamper=on_phase(number, change),
            )
    # an extra element in a chosen word decodes to an exact zero
    assert_same_bits(
        simulate(
            [LosslessSparse(world, exponents="max") for _ in xs], xs, tamper=on_phase(2, add_bit)
        )[0],
        expected,
    )
    with pytest.raises(ValueError, match="index_levels"):
        LosslessSparse(world, index_levels=3)
