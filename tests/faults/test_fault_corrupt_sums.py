"""The lossless sketch decoder fed sums the switch never produced (every cell of a phase
replaced by random words, runs of zeros, all ones, a wrapped offset): each ends in a
CorruptResultError (or the exact sum, when the corruption missed what the decoder reads)
within a bounded time: never a hang, never a wrong result returned as right.
tests/worker/test_codecs_lossless.py already covers single bit flips, small noise, and
corrupted bitmaps and exponents."""

from __future__ import annotations

import time

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import CorruptResultError, LosslessSparse, NonFiniteError
from homagg.worker.codecs.simulate import simulate

WORLD, N, TRIALS = 3, 20_000, 40
BOUND_S = 10.0  # per decode; a decode takes milliseconds


def inputs(rng: np.random.Generator) -> list[np.ndarray]:
    xs = []
    for _ in range(WORLD):
        x = np.zeros(N, np.float32)
        idx = rng.choice(N, 300, replace=False)
        x[idx] = rng.standard_normal(idx.size).astype(np.float32)
        xs.append(x)
    return xs


def corruptions(rng: np.random.Generator):
    def random_words(c):
        return rng.integers(-(2**31), 2**31, c.size, dtype=np.int64).astype(np.int32)

    def zero_run(c):
        c = c.copy()
        start = int(rng.integers(c.size))
        c[start : start + int(rng.integers(1, 64))] = 0
        return c

    def all_ones(c):
        return np.full_like(c, -1)

    def offset(c):
        return (c.astype(np.int64) + int(rng.integers(1, 2**31))).astype(np.int64).astype(np.int32)

    def swap_halves(c):
        return np.roll(c, c.size // 2)

    return [random_words, zero_run, all_ones, offset, swap_halves]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("values", ["sketch", "ranked"])
@pytest.mark.parametrize("phase_op", [Op.ADD, Op.OR, Op.MAX], ids=["add", "or", "max"])
def test_corrupted_sums_are_an_error_in_bounded_time(values, phase_op, fault_report):
    rng = np.random.default_rng(int(phase_op) * 10 + (values == "ranked"))
    # the exponents ride the OR phase; their MAX phase of their own is corrupted in that form
    exponents = "max" if phase_op == Op.MAX else "or"
    detected = exact = 0
    slowest = 0.0
    for trial in range(TRIALS):
        xs = inputs(rng)
        codecs = [LosslessSparse(WORLD, values=values, exponents=exponents) for _ in xs]
        expected = simulate(codecs, xs)[0]
        change = corruptions(rng)[trial % 5]
        hit = {"n": 0}

        def tamper(step, phase, combined, hit=hit, change=change):
            if phase.op == phase_op and hit["n"] == 0:
                hit["n"] += 1
                return change(combined.copy())
            return combined

        started = time.monotonic()
        try:
            codecs = [LosslessSparse(WORLD, values=values, exponents=exponents) for _ in xs]
            out = simulate(codecs, xs, tamper=tamper)
        except (CorruptResultError, NonFiniteError):  # a set top exponent bit reads as inf/nan
            detected += 1
        else:
            np.testing.assert_array_equal(
                out[0].view(np.uint32),
                expected.view(np.uint32),
                err_msg=f"trial {trial}: a corrupted sum decoded to a wrong result",
            )
            exact += 1
        took = time.monotonic() - started
        slowest = max(slowest, took)
        assert took < BOUND_S, f"trial {trial} took {took:.1f} s"
    fault_report(
        f"{TRIALS} corrupted {phase_op.name} phases: {detected} detected, {exact} still exact, "
        f"slowest decode {slowest * 1e3:.0f} ms"
    )
    assert detected > 0
