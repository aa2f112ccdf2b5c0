"""DC2-style delay-aware compression control (`codec="auto"`): per bucket, the measured cost
of its aggregation is compared with the compute time available to hide it (its budget) and
with the cost of the host path (the process group's all_reduce, what DDP over gloo does).
The switch keeps a bucket only while its agreed measured cost is the lower one; on the
switch, the bucket's density follows multiplicative increase of compression on overrun and
additive decrease on slack (DC2); exploring the path that currently loses is paid for from
a credit the host path earns (a share `explore` of its time), so exploration is bounded
and amortized (docs/worker.md). Decisions come only from measurements agreed by every rank
(MIN of the costs and of the budgets), so every rank picks the same path for every bucket.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from worker.codecs import exact_codecs, is_exact

log = logging.getLogger(__name__)

HOST = "host"  # the process group's all_reduce: chosen when the switch path cannot win
# Lossy codecs whose compression is fixed by their name (density = wire cells per dense
# cell): the low-bit lanes pack two or four values per cell (their exponents add 1/1024).
FIXED_DENSITY: dict[str, float] = {"lowbit16": 0.5, "lowbit8": 0.25}
# A ratio codec's wire cells per selected entry: CLT-k sends k indices and k values, so
# density d is ratio d / 2 (at ratio 1/2 it sends as many cells as the exact codec).
WIRE_PER_ENTRY: dict[str, float] = {"cltk": 2.0}
LANE_CODECS = tuple(FIXED_DENSITY)  # considered only on a switch that adds lanes
DEFAULT_CODECS = ("lossless", "fixed_point", "cltk")


def auto_codecs(lanes: bool) -> tuple[str, ...]:
    """The default codecs of the controller: the exact ones, the low-bit lanes when the
    switch adds them, then CLT-k (densities below the lanes')."""
    return (*DEFAULT_CODECS[:2], *(LANE_CODECS if lanes else ()), *DEFAULT_CODECS[2:])


@dataclass(frozen=True)
class Choice:
    """A bucket's path for one step: a codec name (or HOST) and its wire density."""

    method: str
    density: float = 1.0

    @property
    def label(self) -> str:
        """Short text for logs and stats: `lossless`, `cltk@0.0625`, `host`."""
        if self.method == HOST or self.density >= 1.0 or self.method in FIXED_DENSITY:
            return self.method
        return f"{self.method}@{self.density:.3g}"

    def options(self) -> dict[str, float]:
        """The codec options this choice sets (a ratio codec's ratio)."""
        if self.method == HOST or self.density >= 1.0 or self.method in FIXED_DENSITY:
            return {}
        return {"ratio": self.density / WIRE_PER_ENTRY.get(self.method, 1.0)}


@dataclass
class AutoConfig:
    """The controller's rule: codecs (exact ones first, then lossy ones from the least to
    the most compressing), MI/AD parameters, and the exploration budget."""

    codecs: Sequence[str] = DEFAULT_CODECS
    min_density: float = 1 / 16  # the most compression (lossy) it tries
    increase: float = 2.0  # compression multiplied by this on overrun
    decrease: float = 0.05  # density added per step of slack
    slack: float = 0.5  # a cost below slack * budget is slack
    tolerance: float = 0.05  # share of the iteration time a bucket may stay exposed
    explore: float = 0.1  # exploration may cost at most this share of the host path's time
    pays: float = 0.9  # compressing further pays when it cuts the cost below this share
    fresh_steps: int = 10  # a cost measured longer ago is stale (measured again first)
    sparse_below: float = 0.5  # nonzero share under which the exact codec is lossless

    def __post_init__(self) -> None:
        if not self.codecs or not is_exact(self.codecs[0]):
            raise ValueError(f"auto: the first codec must be exact, one of {exact_codecs()}")
        if not 0 < self.min_density < 1 or self.increase <= 1 or self.decrease <= 0:
            raise ValueError("auto: need 0 < min_density < 1, increase > 1, decrease > 0")
        if self.explore <= 0 or not 0 < self.pays <= 1 or self.fresh_steps < 2:
            raise ValueError("auto: need explore > 0, 0 < pays <= 1 and fresh_steps >= 2")

    @property
    def exact(self) -> list[str]:
        """The listed exact codecs."""
        return [n for n in self.codecs if is_exact(n)]

    @property
    def lossy(self) -> list[str]:
        """The listed lossy codecs."""
        return [n for n in self.codecs if not is_exact(n)]


@dataclass
class Cost:
    """An agreed cost (seconds) and the step it was measured in."""

    seconds: float
    step: int


@dataclass
class BucketControl:
    """One bucket's controller state. The first step runs the host path (nothing is
    known yet), the second the switch's exact codec, then the rule decides."""

    exact: str = ""  # the bucket's exact codec (from its nonzero share, first decision)
    density: float = 1.0  # the switch path's wire density (MI/AD)
    on_host: bool = True
    costs: dict[str, Cost] = field(default_factory=dict)  # by arm: HOST or density key
    credit: float = 0.0  # seconds of exploration paid for: `explore` x the time it ran
    floor: float = 0.0  # compressing below this density did not pay (0: not known) ...
    floor_step: int = 0  # ... as measured at this step
    ran: Choice | None = None  # what ran this step (None: the agreed fallback)
    incumbent: tuple[str, float] | None = None  # the cheapest arm known at the last decision


def _snap(density: float) -> float:
    """A density rounded to 6 significant digits and at most 1 (additive steps drift)."""
    return min(1.0, float(f"{density:.6g}"))


def _key(density: float) -> str:
    return f"{density:.6g}"


def arm_key(choice: Choice) -> str:
    """The key of a choice's cost: HOST, or the density its codec sends."""
    return HOST if choice.method == HOST else _key(choice.density)


@dataclass
class AutoController:
    """Per-bucket choices; `measurements` and `decide` run once a step, on agreed numbers
    only, so `choice` answers alike on every rank."""

    config: AutoConfig = field(default_factory=AutoConfig)
    buckets: dict[int, BucketControl] = field(default_factory=dict)
    costs: dict[int, float] = field(default_factory=dict)  # this step, local
    nonzero: dict[int, float] = field(default_factory=dict)  # this step, local
    history: list[dict[int, str]] = field(default_factory=list)
    agreed: dict[int, tuple[float, float]] = field(default_factory=dict)  # last (cost, budget)
    step: int = 0
    held: bool = False  # every bucket on its exact switch codec, nothing learned (DeAR tuning)

    def choice(self, index: int) -> Choice:
        """The path of bucket `index` this step."""
        b = self.buckets.setdefault(index, BucketControl())
        if self.held:
            return Choice(b.exact or self.config.codecs[0])
        if b.on_host or not b.exact:
            return Choice(HOST)
        return self.codec_at(b.density, b.exact)

    def codec_at(self, density: float, exact: str = "") -> Choice:
        """The least compressing listed codec that compresses at least down to `density`
        (`exact`, or the first listed codec, at density 1)."""
        if density >= 1.0:
            return Choice(exact or self.config.codecs[0])
        lossy = self.config.lossy
        fixed = [n for n in lossy if n in FIXED_DENSITY and FIXED_DENSITY[n] <= density]
        if fixed:
            best = max(fixed, key=lambda n: FIXED_DENSITY[n])
            return Choice(best, FIXED_DENSITY[best])
        ratio = [n for n in lossy if n not in FIXED_DENSITY]
        if ratio:
            return Choice(ratio[0], density)
        fixed = [n for n in lossy if n in FIXED_DENSITY]
        if fixed:  # nothing compresses this much: the most compressing one
            best = min(fixed, key=lambda n: FIXED_DENSITY[n])
            return Choice(best, FIXED_DENSITY[best])
        return Choice(exact or self.config.codecs[0])

    def hold(self) -> None:
        """Run every bucket on its exact switch codec and learn nothing until `release`
        (while DeAR tunes its bucket size: the sizes are compared on one path)."""
        self.held = True

    def release(self) -> None:
        """Start learning afresh (the buckets may have changed while held)."""
        self.held = False
        self.buckets.clear()

    def known(self, index: int) -> bool:
        """Whether bucket `index`'s exact codec is decided (its nonzero share is not needed)."""
        b = self.buckets.get(index)
        return b is not None and bool(b.exact)

    def record(self, index: int, seconds: float, ran: Choice | None, nonzero: float) -> None:
        """This rank's measurement of bucket `index` this step: the seconds its path took
        (`ran` None: the switch path fell back, agreed) and its nonzero share."""
        self.costs[index] = seconds
        self.nonzero[index] = nonzero
        self.buckets.setdefault(index, BucketControl()).ran = ran

    def measurements(self, indices: Sequence[int], budgets: dict[int, float]) -> np.ndarray:
        """[-cost_i..., -budget_i..., nonzero_i...] for MAX over ranks: the smallest cost,
        the smallest budget and the largest nonzero share of each bucket. The smallest
        cost is the path's own: a rank that handed its bucket over early waits for the
        last one, and the last one, whose time is the smallest, does not."""
        c = [-self.costs.get(i, 0.0) for i in indices]
        b = [-budgets.get(i, 0.0) for i in indices]
        z = [self.nonzero.get(i, 1.0) for i in indices]
        return np.array(c + b + z, dtype=np.float64)

    def decide(self, indices: Sequence[int], agreed: np.ndarray) -> dict[int, str]:
        """Next step's choices from the agreed vector (identical on every rank)."""
        n = len(indices)
        out: dict[int, str] = {}
        for j, index in enumerate(indices):
            cost, budget, nonzero = -float(agreed[j]), -float(agreed[n + j]), agreed[2 * n + j]
            self.agreed[index] = (cost, budget)
            b = self.buckets.setdefault(index, BucketControl())
            if not b.exact:
                b.exact = self._exact_for(float(nonzero))
            if b.ran is not None and not self.held:
                self._update(b, cost, budget)
            b.ran = None
            out[index] = self.choice(index).label
        self.costs.clear()
        self.nonzero.clear()
        self.history.append(out)
        self.step += 1
        log.info("auto step %d: %s", self.step, self._describe(out))
        return out

    def _describe(self, out: dict[int, str]) -> str:
        return ", ".join(
            f"bucket {i} {self.agreed[i][0] * 1e3:.1f}/{self.agreed[i][1] * 1e3:.1f} ms -> {c}"
            for i, c in out.items()
        )

    def _exact_for(self, nonzero: float) -> str:
        """A mostly-zero bucket takes the lossless codec, a dense one fixed point (when
        both are listed; else the first listed)."""
        exact = self.config.exact
        want = "lossless" if nonzero < self.config.sparse_below else "fixed_point"
        return want if want in exact else exact[0]

    # -- the rule ----------------------------------------------------------------------

    def _fresh(self, b: BucketControl, key: str) -> float | None:
        """The agreed cost of an arm, if measured within the last fresh_steps steps."""
        got = b.costs.get(key)
        if got is None or self.step - got.step >= self.config.fresh_steps:
            return None
        return got.seconds

    def _best(self, b: BucketControl, switch_only: bool = False) -> tuple[str, float] | None:
        """(arm key, cost) of the cheapest arm with a fresh cost, if any."""
        fresh = [(k, self._fresh(b, k)) for k in b.costs if not (switch_only and k == HOST)]
        known = [(k, s) for k, s in fresh if s is not None]
        return min(known, key=lambda x: x[1]) if known else None

    def _update(self, b: BucketControl, cost: float, budget: float) -> None:
        """Account for what ran (cost, exploration ledger), then choose the next arm."""
        assert b.ran is not None
        c, key = self.config, arm_key(b.ran)
        # the ledger: every step earns `explore` of its cost; a step on another arm than
        # the cheapest known when it was chosen (an exploration) pays what it left exposed
        # beyond that one's cost and its budget, but for the first measurement of each
        # path (the price of knowing both at all)
        first = not any((k == HOST) == (key == HOST) for k in b.costs)
        best = b.incumbent
        explored = best is not None and best[0] != key and not first
        if explored and best is not None:  # its exposure beyond the incumbent's
            b.credit -= max(0.0, cost - max(best[1], budget))
        b.credit += c.explore * cost
        old = self._fresh(b, key)
        steady = old is not None and 0.5 * old <= cost <= 2.0 * old  # else: conditions changed
        b.costs[key] = Cost(0.5 * (old + cost) if steady and old else cost, self.step)
        if b.ran.method == HOST:
            self._after_host(b, cost, budget)
        else:
            self._after_switch(b, b.density, cost, budget)
        b.incumbent = self._best(b)

    def _affords(self, b: BucketControl, expected: float, incumbent: float) -> bool:
        """Whether to run one step at `expected` instead of `incumbent`: it is expected to
        win, or the credit pays for the difference."""
        return expected < incumbent or b.credit >= expected - incumbent

    def _after_host(self, b: BucketControl, host: float, budget: float) -> None:
        """On the host path: back to the switch when a fresh switch cost is lower, or when
        the credit pays for a probe at the density the cost model expects to win."""
        best = self._best(b, switch_only=True)
        if best is not None and best[1] < host:
            b.density, b.on_host = float(best[0]), False
            return
        b.density = 1.0 if host <= budget else self._probe_density(b, host)
        if self._affords(b, self._predicted(b, b.density), host):
            b.on_host = False

    def _after_switch(self, b: BucketControl, d: float, cost: float, budget: float) -> None:
        """On the switch path at density d (the rule's; the codec sends `_sent(d)`):
        hidden, DC2's additive decrease on slack; overrun, the host path when it hides the
        bucket exactly or is measured cheaper, else multiplicative increase of compression
        while compressing pays."""
        c = self.config
        if cost <= budget:
            if cost < c.slack * budget and d < 1.0:
                b.density = _snap(d + c.decrease)
            return
        host = self._fresh(b, HOST)
        if host is None:  # never measured, or stale: measure it (when the credit pays)
            if HOST not in b.costs or self._affords(b, b.costs[HOST].seconds, cost):
                b.on_host = True
                return
            host = b.costs[HOST].seconds
        coarser = min(1.0, d * c.increase)
        sent = self._sent(b, d)
        was = self._fresh(b, _key(self._sent(b, coarser))) if sent < 1.0 else None
        if was is not None and cost > c.pays * was:  # compressing to d did not pay
            b.floor, b.floor_step = coarser, self.step
        finer = _snap(max(self._floor(b), d / c.increase))
        paid = was is None or cost <= c.pays * was
        if host <= budget:  # the host path hides it, exactly: no compression needed
            b.on_host, b.density = True, 1.0
        elif self._sent(b, finer) < sent and paid and min(cost, self._predicted(b, finer)) < host:
            b.density = finer  # overrun: compress more (MI) while it pays and can win
        elif cost <= host:
            best = self._best(b, switch_only=True)
            b.density = float(best[0]) if best is not None else d
        else:  # the host path is cheaper: it runs until a probe pays
            b.on_host, b.density = True, self._probe_density(b, host)

    def _floor(self, b: BucketControl) -> float:
        """The lowest density worth trying: min_density, or where compressing stopped
        paying (while that measurement is fresh)."""
        c = self.config
        return max(c.min_density, b.floor if self.step - b.floor_step < c.fresh_steps else 0.0)

    def _model(self, b: BucketControl) -> tuple[float, float]:
        """(fixed, per density) of the switch's cost, fitted by least squares to the last
        cost at each density tried; one density tried: proportional (fixed 0)."""
        pts = [(float(k), v.seconds) for k, v in b.costs.items() if k != HOST]
        if not pts:
            return 0.0, 0.0
        ds = np.array([p[0] for p in pts])
        ss = np.array([p[1] for p in pts])
        if np.ptp(ds) == 0:
            return 0.0, float(ss.mean() / ds[0])
        slope, fixed = np.polyfit(ds, ss, 1)
        if fixed < 0 or slope < 0:  # keep the model monotone and non-negative
            slope, fixed = max(0.0, float(slope)), max(0.0, float(fixed))
        return float(fixed), float(slope)

    def _sent(self, b: BucketControl, density: float) -> float:
        """The density the codec chosen at `density` sends (a lane codec's is fixed)."""
        return self.codec_at(density, b.exact).density

    def _predicted(self, b: BucketControl, density: float) -> float:
        """The switch's expected cost at `density`: its last agreed cost there, else the
        cost model's."""
        sent = self._sent(b, density)
        got = b.costs.get(_key(sent))
        if got is not None:
            return got.seconds
        fixed, slope = self._model(b)
        return fixed + slope * sent

    def _probe_density(self, b: BucketControl, host: float) -> float:
        """The least compression (largest density on the ladder 1, 1/increase, ... down to
        the floor) expected to beat the host path by the `pays` margin; when none is, the
        cheapest expected (the least compression among those within that margin)."""
        c = self.config
        ladder: list[float] = []
        d = 1.0
        while d >= self._floor(b) - 1e-12:
            if not ladder or self._sent(b, d) < self._sent(b, ladder[-1]):
                ladder.append(_snap(d))
            d /= c.increase
        expected = [(x, self._predicted(b, x)) for x in ladder]
        winners = [x for x, e in expected if e <= c.pays * host]
        if winners:
            return max(winners)
        low = min(e for _, e in expected)
        return max(x for x, e in expected if e * c.pays <= low)
