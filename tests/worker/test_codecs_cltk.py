"""CLT-k: leader rotation, one index set for all, exact sums of the quantized selected
values, the low-pass memory update."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker.codecs import CLTK, FixedPoint, NonFiniteError, simulate
from homagg.worker.codecs.cltk import top_k_indices
from homagg.worker.codecs.exponent import dense_exponents, headroom_bits, quantize


def gradients(rng: np.random.Generator, world: int, n: int) -> list[np.ndarray]:
    return [
        (rng.standard_normal(n) * rng.uniform(0.1, 10)).astype(np.float32) for _ in range(world)
    ]


def test_top_k_indices():
    x = np.array([0.1, -5, 3, 0, -0.2, 4], np.float32)
    assert top_k_indices(x, 3).tolist() == [1, 2, 5]
    assert top_k_indices(x, 10).tolist() == list(range(6))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_leader_rotation_indices_sums_and_memory(world):
    rng = np.random.default_rng(world)
    n, ratio, beta, block = 3000, 0.02, 0.1, 256
    codecs = [CLTK(world, r, ratio=ratio, beta=beta, block=block) for r in range(world)]
    memory = [np.zeros(n, np.float32) for _ in range(world)]
    k = codecs[0].k_for(n)
    assert k == 60
    p_bits = headroom_bits(world)
    for step in range(2 * world + 1):
        gs = gradients(rng, world, n)
        ps = [m + g for m, g in zip(memory, gs)]
        log, results = [], []

        def observe(step, phase, combined, results=results):
            results.append(combined)
            return combined

        outs = simulate(codecs, gs, phases_log=log, tamper=observe)
        assert [ph.op for ph in log] == [Op.MAX, Op.ADD]
        exps = np.max([dense_exponents(p, block) for p in ps], axis=0)
        assert log[0].cells.size == k + exps.size and log[1].cells.size == k + 1
        leader = step % world
        idx = top_k_indices(ps[leader], k)
        assert np.array_equal(results[0][:k], idx)  # everyone got the leader's indices
        sent = [ph.cells[:k] for ph in log[:1]]
        assert np.all(sent[0] == -1) == (leader != 0)
        shift = p_bits - exps[idx // block]
        qs = [quantize(p[idx], shift, p_bits) for p in ps]
        expected = np.zeros(n, np.float32)
        expected[idx] = np.ldexp(
            np.sum(qs, axis=0, dtype=np.int64).astype(np.float64), -shift
        ).astype(np.float32)
        for out in outs:
            assert np.array_equal(out, expected)
            assert np.array_equal(np.flatnonzero(out), np.flatnonzero(expected))
        for w in range(world):  # m = (1 - beta) m + beta (p - c)
            c = np.zeros(n, np.float32)
            c[idx] = np.ldexp(qs[w].astype(np.float64), -shift).astype(np.float32)
            want = (1 - beta) * memory[w].astype(np.float64) + beta * (ps[w].astype(np.float64) - c)
            assert np.allclose(codecs[w].memory, want, rtol=1e-6, atol=1e-6)
            memory[w] = codecs[w].memory.copy()
        assert all(c.step == step + 1 for c in codecs)


def test_full_ratio_equals_dense_fixed_point():
    rng = np.random.default_rng(11)
    world, n = 4, 1000
    gs = gradients(rng, world, n)
    a = simulate([CLTK(world, r, ratio=1.0, block=128) for r in range(world)], gs)[0]
    b = simulate([FixedPoint(world, block=128) for _ in range(world)], gs)[0]
    assert np.array_equal(a, b)


def test_memory_accumulates_what_was_not_sent():
    world, n = 2, 100
    g = np.zeros(n, np.float32)
    g[:10] = np.arange(1, 11)
    codecs = [CLTK(world, r, ratio=0.05, beta=1.0) for r in range(world)]
    out = simulate(codecs, [g, g])[0]
    assert np.flatnonzero(out).tolist() == [5, 6, 7, 8, 9]
    assert np.allclose(codecs[0].memory[:5], np.arange(1, 6))  # beta = 1: plain error feedback
    out = simulate(codecs, [np.zeros(n, np.float32)] * 2)[0]
    assert np.allclose(out[:5], 2 * np.arange(1, 6))  # sent a step later


def test_non_finite_raises_everywhere():
    world = 3
    gs = [np.ones(100, np.float32) for _ in range(world)]
    gs[1][4] = np.nan
    with pytest.raises(NonFiniteError):
        simulate([CLTK(world, r) for r in range(world)], gs)
