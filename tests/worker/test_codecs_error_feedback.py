"""Error feedback: the residual is carried, so what is sent tracks what was computed."""

from __future__ import annotations

import numpy as np

from homagg.worker.codecs import CLTK, ErrorFeedback, FixedPoint, simulate


def test_residual_identity_and_running_sums_with_low_precision():
    rng = np.random.default_rng(1)
    world, n, steps = 3, 200, 60
    ef = [ErrorFeedback(FixedPoint(world, bits=8, block=50), gamma=1.0) for _ in range(world)]
    plain = [FixedPoint(world, bits=8, block=50) for _ in range(world)]
    sent_total = np.zeros(n)
    plain_total = np.zeros(n)
    true_total = np.zeros(n)
    for _ in range(steps):
        # small steady gradients below half a quantum (2^-5 with E = 1, P = 5 for 8-bit lanes)
        gs = [(0.01 + rng.standard_normal(n) * 0.002).astype(np.float32) for _ in range(world)]
        for g in gs:
            g[::50] = 1.0  # sets each block's exponent
        true_total += np.sum(gs, axis=0, dtype=np.float64)
        sent_total += simulate(ef, gs)[0]
        plain_total += simulate(plain, gs)[0]
    residual = np.sum([c.residual for c in ef], axis=0, dtype=np.float64)
    # gamma = 1 telescopes: sum of sent = sum of gradients - final residuals
    assert np.allclose(sent_total, true_total - residual, atol=1e-4)
    ef_err = np.abs(sent_total - true_total).max()
    plain_err = np.abs(plain_total - true_total).max()
    assert ef_err <= world * 2.0**-5  # bounded by the residuals: one quantum per worker
    assert plain_err > 0.9 * steps * world * 0.01  # without feedback it is all lost


def test_residual_formula_with_gamma():
    rng = np.random.default_rng(2)
    world, n, gamma = 2, 64, 0.9
    ef = [ErrorFeedback(FixedPoint(world, bits=4), gamma=gamma) for _ in range(world)]
    for _ in range(5):
        before = [np.zeros(n, np.float32) if c.residual is None else c.residual.copy() for c in ef]
        gs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
        vs = [g + np.float32(gamma) * e for g, e in zip(gs, before)]
        total = simulate(ef, gs)[0]
        sent = [v - c.residual for v, c in zip(vs, ef)]  # Q(v) = v - e
        assert np.allclose(total, np.sum(sent, axis=0), atol=1e-5)
        q_direct = simulate([FixedPoint(world, bits=4) for _ in range(world)], vs)[0]
        assert np.array_equal(total, q_direct)


def test_error_feedback_around_cltk():
    rng = np.random.default_rng(3)
    world, n = 4, 500
    codecs = [ErrorFeedback(CLTK(world, r, ratio=0.02), gamma=1.0) for r in range(world)]
    g = [(rng.standard_normal(n)).astype(np.float32) for _ in range(world)]
    total = np.zeros(n)
    for _step in range(200):
        total += simulate(codecs, g)[0]
    expected = 200 * np.sum(g, axis=0, dtype=np.float64)
    residual = np.sum([c.residual for c in codecs], axis=0, dtype=np.float64)
    assert np.allclose(total, expected - residual, rtol=1e-4, atol=1e-2)
    assert np.abs(residual).max() < 0.25 * np.abs(expected).max()
