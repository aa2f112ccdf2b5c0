"""DC2-style delay-aware compression control (`codec="auto"`): per bucket, the aggregation
delay is compared with the compute time available to hide it, and the bucket's density for
the next step follows multiplicative increase of compression on overrun and additive
decrease on slack. Decisions come only from measurements agreed by every rank (MAX of the
delays, MIN of the budgets), so every rank picks the same codec for every bucket."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from worker.codecs import exact_codecs, is_exact

log = logging.getLogger(__name__)

HOST = "host"  # the process group's all_reduce: chosen when the switch path cannot win
# Lossy codecs whose compression is fixed by their name (density = wire cells per dense
# cell); a codec not listed here takes its density as its `ratio` option (CLT-k). The
# low-bit lanes pack two or four values per cell (their exponent cells add 1/1024).
FIXED_DENSITY: dict[str, float] = {"lowbit16": 0.5, "lowbit8": 0.25}


@dataclass(frozen=True)
class Choice:
    """A bucket's path for one step: a codec name (or HOST) and its options."""

    method: str
    density: float = 1.0

    @property
    def label(self) -> str:
        """Short text for logs and stats: `lossless`, `cltk@0.062`, `host`."""
        if self.method == HOST or self.density >= 1.0 or self.method in FIXED_DENSITY:
            return self.method
        return f"{self.method}@{self.density:.3g}"

    def options(self) -> dict[str, float]:
        """The codec options this choice sets (the ratio of a ratio codec)."""
        if self.method == HOST or self.density >= 1.0 or self.method in FIXED_DENSITY:
            return {}
        return {"ratio": self.density}


@dataclass
class BucketControl:
    """One bucket's controller state."""

    density: float = 1.0
    host_steps: int = 0  # steps left on the host path before probing the switch again
    floor_delay: float = 0.0  # agreed switch delay measured at the minimum density
    exact_delay: float | None = None  # agreed delay the last time the exact codec ran
    exact_steps: int = 0  # steps left on the exact codec after compression did not pay


@dataclass
class AutoConfig:
    """The controller's rule: codecs from exact to most compressed, MI/AD parameters."""

    codecs: Sequence[str] = ("lossless", "cltk")
    min_density: float = 1 / 256
    increase: float = 2.0  # compression multiplied by this on overrun
    decrease: float = 0.05  # density added per step of slack
    slack: float = 0.5  # delay below slack * budget counts as slack
    tolerance: float = 0.05  # share of the iteration time a bucket may stay exposed
    probe_every: int = 20  # steps on the host path (or held exact) before probing again

    def __post_init__(self) -> None:
        if not self.codecs or not is_exact(self.codecs[0]):
            raise ValueError(f"auto: the first codec must be exact, one of {exact_codecs()}")
        if not 0 < self.min_density < 1 or self.increase <= 1 or self.decrease <= 0:
            raise ValueError("auto: need 0 < min_density < 1, increase > 1, decrease > 0")


@dataclass
class AutoController:
    """Per-bucket choices and the MI/AD rule; `measurements` and `decide` run once a step,
    on agreed numbers only."""

    config: AutoConfig = field(default_factory=AutoConfig)
    buckets: dict[int, BucketControl] = field(default_factory=dict)
    delays: dict[int, float] = field(default_factory=dict)  # this step, local
    budgets: dict[int, float] = field(default_factory=dict)  # this step, local
    history: list[dict[int, str]] = field(default_factory=list)
    agreed: dict[int, tuple[float, float]] = field(default_factory=dict)  # last (delay, budget)

    def choice(self, index: int) -> Choice:
        """The path of bucket `index` this step."""
        b = self.buckets.setdefault(index, BucketControl())
        if b.host_steps > 0:
            return Choice(HOST)
        return self.codec_at(1.0 if b.exact_steps > 0 else b.density)

    def codec_at(self, density: float) -> Choice:
        """The least compressing listed codec that compresses at least down to `density`."""
        names = self.config.codecs
        if density >= 1.0:
            return Choice(names[0])
        fixed = [n for n in names[1:] if n in FIXED_DENSITY and FIXED_DENSITY[n] <= density]
        if fixed:
            best = max(fixed, key=lambda n: FIXED_DENSITY[n])
            return Choice(best, FIXED_DENSITY[best])
        ratio = [n for n in names[1:] if n not in FIXED_DENSITY]
        if ratio:
            return Choice(ratio[0], density)
        lossy = [n for n in names[1:] if n in FIXED_DENSITY]
        if lossy:  # nothing compresses this much: the most compressing one
            best = min(lossy, key=lambda n: FIXED_DENSITY[n])
            return Choice(best, FIXED_DENSITY[best])
        return Choice(names[0])

    def record(self, index: int, delay: float, budget: float | None = None) -> None:
        """A local measurement of this step: the bucket's delay (and its budget)."""
        self.delays[index] = delay
        if budget is not None:
            self.budgets[index] = budget

    def measurements(self, indices: Sequence[int]) -> np.ndarray:
        """[delay_i..., -budget_i...] for MAX over ranks: the largest delay, smallest budget."""
        d = [self.delays.get(i, 0.0) for i in indices]
        b = [-self.budgets.get(i, 0.0) for i in indices]
        return np.array(d + b, dtype=np.float64)

    def decide(self, indices: Sequence[int], agreed: np.ndarray) -> dict[int, str]:
        """Next step's choices from the agreed vector (identical on every rank)."""
        n = len(indices)
        out: dict[int, str] = {}
        for j, index in enumerate(indices):
            delay, budget = float(agreed[j]), -float(agreed[n + j])
            self.agreed[index] = (delay, budget)
            self._update(index, delay, budget)
            out[index] = self.choice(index).label
        self.delays.clear()
        self.budgets.clear()
        self.history.append(out)
        log.info(
            "auto step %d: %s",
            len(self.history),
            ", ".join(
                f"bucket {i} {self.agreed[i][0] * 1e3:.1f}/{self.agreed[i][1] * 1e3:.1f} ms -> {c}"
                for i, c in out.items()
            ),
        )
        return out

    def _update(self, index: int, delay: float, budget: float) -> None:
        c = self.config
        b = self.buckets.setdefault(index, BucketControl())
        if b.host_steps > 0:  # on the host path, `delay` is the host all_reduce's
            b.host_steps = 0 if delay > b.floor_delay else b.host_steps - 1
            return
        if b.exact_steps > 0 or b.density >= 1.0:
            b.exact_delay = delay
        if b.exact_steps > 0:  # held exact: compression did not pay the last time
            b.exact_steps -= 1
            return
        if b.density < 1.0 and b.exact_delay is not None and delay >= b.exact_delay:
            # lossless pays: compressing made this bucket no faster (e.g. a sparse gradient
            # the exact codec already shrinks); hold exact, probe again later
            b.density, b.exact_steps = 1.0, c.probe_every
            return
        if delay > budget:
            if b.density <= c.min_density:
                b.floor_delay, b.host_steps = delay, c.probe_every  # the switch cannot win
            else:
                b.density = max(c.min_density, b.density / c.increase)
        elif delay < c.slack * budget:
            b.density = min(1.0, b.density + c.decrease)
