"""Error feedback around any lossy codec (CO3's correct step): v = g + gamma * e, send
Q(v), keep e = v - Q(v) for the next step."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from .base import GradInput, LossyCodec, Phase, output_shape, to_dense


class ErrorFeedback:
    """Wraps a LossyCodec (FixedPoint with few bits, CLTK, ...) so that what it drops
    is carried into the next step instead of lost."""

    def __init__(self, inner: LossyCodec, gamma: float = 0.9):
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], not {gamma}")
        self.inner = inner
        self.gamma = gamma
        self.residual: np.ndarray | None = None

    def aggregate(self, x: GradInput) -> Generator[Phase, np.ndarray, np.ndarray]:
        """The inner codec's decoded sum of v = g + gamma * e; then e = v - Q(v)."""
        shape = output_shape(x)
        g = to_dense(x)
        if self.residual is None or self.residual.size != g.size:
            self.residual = np.zeros(g.size, dtype=np.float32)
        v = g + np.float32(self.gamma) * self.residual
        total, sent = yield from self.inner.compress(v)
        self.residual = v - sent.reshape(-1)
        return total.reshape(shape)
