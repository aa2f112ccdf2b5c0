"""Automatic bucket size for DeAR: each candidate size runs a few iterations (after one to
warm up), the iteration times are agreed by every rank (MAX), and the fastest candidate is
kept. DeAR tunes its fusion buffers by Bayesian optimization; a sweep over a few sizes
measures the same thing on the handful of sizes that matter for our models."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


class BucketTuner:
    """Candidate sizes (bytes) tried in order; `on_iteration` returns a new size to use
    from this iteration on, or None. Sizes that would give the same single bucket as a
    smaller one are skipped."""

    def __init__(self, candidates: Sequence[int], model_bytes: int, steps: int = 3) -> None:
        if not candidates or min(candidates) <= 0 or steps < 1:
            raise ValueError("bucket tuner: need positive candidate sizes and steps >= 1")
        sizes = sorted(set(candidates))
        kept = [s for s in sizes if s < model_bytes] or sizes[:1]
        if len(kept) < len(sizes) and kept[-1] != sizes[-1] and sizes[-1] >= model_bytes:
            kept.append(next(s for s in sizes if s >= model_bytes))  # the one-bucket size
        self.candidates = kept
        self.steps = steps
        self.times: list[float] = [0.0] * len(kept)
        self.chosen: int | None = kept[0] if len(kept) == 1 else None
        self._i = 0  # candidate being measured
        self._seen = 0  # iterations started with it
        self._last: float | None = None

    @property
    def current(self) -> int:
        """The size in use now."""
        return self.chosen if self.chosen is not None else self.candidates[self._i]

    def on_iteration(self, now: float, agree: Callable[[list[float]], list[float]]) -> int | None:
        """Called at the start of every iteration (the same iterations on every rank)."""
        if self.chosen is not None:
            return None
        if self._last is not None and self._seen >= 2:  # the first one warms up
            self.times[self._i] += now - self._last
        self._last = now
        self._seen += 1
        if self._seen <= self.steps + 1:
            return None
        if self._i + 1 < len(self.candidates):
            self._i, self._seen = self._i + 1, 1
            return self.candidates[self._i]
        agreed = agree([t / self.steps for t in self.times])
        self.times = agreed
        best = min(range(len(agreed)), key=agreed.__getitem__)
        self.chosen = self.candidates[best]
        log.info("DeAR bucket size %d bytes (iteration s by size: %s)", self.chosen, self.report())
        return self.chosen

    def report(self) -> dict[int, float]:
        """Agreed seconds per iteration by candidate size (after tuning)."""
        return dict(zip(self.candidates, self.times))
