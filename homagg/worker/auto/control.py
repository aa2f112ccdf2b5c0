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
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from homagg.worker.auto.costs import HOST, HOST_PLAN, SWITCH_PLAN, ArmCosts, JobLedger, key_of
from homagg.worker.auto.measurements import Measurements, Taken
from homagg.worker.codecs import exact_codecs, is_exact

log = logging.getLogger(__name__)

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
    # steps between a measurement and the first step it decides: 1 takes the agreement off
    # the critical path (step t's numbers, agreed while step t+1 runs, decide step t+2);
    # 0 waits for it before the next step's first bucket
    lag: int = 1
    # settled on the host path, a decision holds for up to this many steps (1, 2, 4, ...
    # doubling while it stays there): the steps between skip the agreement's all_reduce,
    # which through a software switch costs about as much as a small model's step
    lease: int = 8

    def __post_init__(self) -> None:
        if not self.codecs or not is_exact(self.codecs[0]):
            raise ValueError(f"auto: the first codec must be exact, one of {exact_codecs()}")
        if not 0 < self.min_density < 1 or self.increase <= 1 or self.decrease <= 0:
            raise ValueError("auto: need 0 < min_density < 1, increase > 1, decrease > 0")
        if self.explore <= 0 or not 0 < self.pays <= 1 or self.fresh_steps < 2:
            raise ValueError("auto: need explore > 0, 0 < pays <= 1 and fresh_steps >= 2")
        if self.lag not in (0, 1):
            raise ValueError("auto: lag is 0 (decide before the next step) or 1 (pipelined)")
        if self.lease < 1:
            raise ValueError("auto: lease is at least 1 (1: decide every step)")

    @property
    def exact(self) -> list[str]:
        """The listed exact codecs."""
        return [n for n in self.codecs if is_exact(n)]

    @property
    def lossy(self) -> list[str]:
        """The listed lossy codecs."""
        return [n for n in self.codecs if not is_exact(n)]


@dataclass
class BucketControl:
    """One bucket's controller state. The first step runs the host path (nothing is
    known yet; with lag 1 the first two), the next the switch's exact codec, then the
    rule decides."""

    costs: ArmCosts
    exact: str = ""  # the bucket's exact codec (from its nonzero share, first decision)
    density: float = 1.0  # the rule's density on the switch path (MI/AD)
    on_host: bool = True
    floor: float = 0.0  # compressing below this density did not pay (0: not known) ...
    floor_step: int = 0  # ... as measured at this step
    ran: Choice | None = None  # what ran this step (None: the agreed fallback)
    wire: float = 0.0  # the wire density it sent
    incumbent: tuple[str, float] | None = None  # the cheapest arm known at the last decision


def _snap(density: float) -> float:
    """A density rounded to 6 significant digits and at most 1 (additive steps drift)."""
    return min(1.0, float(key_of(density)))


def arm_key(choice: Choice) -> str:
    """The key of a choice's cost: HOST, or the density its codec is chosen at."""
    return HOST if choice.method == HOST else key_of(choice.density)


def auto_option_names() -> list[str]:
    """The rule's settings a user may give as codec options of "auto" (all but `codecs`)."""
    return [f.name for f in fields(AutoConfig) if f.name != "codecs"]


def auto_config(options: dict[str, Any], lanes: bool) -> AutoConfig:
    """The controller's config from codec options (e.g. lag=0, min_density=0.25), over the
    default codecs (the low-bit lanes when the switch adds them); ValueError names an
    unknown option and lists the known ones."""
    bad = sorted(set(options) - set(auto_option_names()))
    if bad:
        raise ValueError(
            f"codec 'auto' has no option {', '.join(bad)}; its options: "
            + ", ".join(auto_option_names())
        )
    return AutoConfig(codecs=auto_codecs(lanes), **options)


@dataclass
class AutoController:
    """Per-bucket choices and the job's exploration ledger; `measurements` and `decide`
    run once a step, on agreed numbers only, so `choice` answers alike on every rank."""

    config: AutoConfig = field(default_factory=AutoConfig)
    buckets: dict[int, BucketControl] = field(default_factory=dict)
    costs: dict[int, float] = field(default_factory=dict)  # this step, local
    nonzero: dict[int, float] = field(default_factory=dict)  # this step, local
    wires: dict[int, float] = field(default_factory=dict)  # this step, local
    history: list[dict[int, str]] = field(default_factory=list)
    agreed: dict[int, tuple[float, float]] = field(default_factory=dict)  # last (cost, budget)
    step: int = 0
    held: bool = False  # every bucket on its exact switch codec, nothing learned (DeAR tuning)
    epoch: int = 0  # releases so far
    lease: int = 0  # steps left that run the last choices without an agreement (`skip`)
    lease_len: int = 1  # the last lease's length (doubles while the host path stays)
    stale: int = 0  # decisions still to come from numbers measured before the last lease
    ledger: JobLedger = field(default_factory=JobLedger)

    def __post_init__(self) -> None:
        self.ledger.explore = self.config.explore

    def bucket(self, index: int) -> BucketControl:
        """Bucket `index`'s state (made on first use)."""
        got = self.buckets.get(index)
        if got is None:
            got = self.buckets[index] = BucketControl(ArmCosts(self.config.fresh_steps))
        return got

    def choice(self, index: int) -> Choice:
        """The path of bucket `index` this step."""
        b = self.bucket(index)
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
        """Start learning afresh (the buckets may have changed while held) from the exact
        switch codecs that ran while held."""
        self.held = False
        self.epoch += 1
        for index, b in self.buckets.items():
            fresh = BucketControl(ArmCosts(self.config.fresh_steps), b.exact, on_host=False)
            self.buckets[index] = fresh
        self.ledger = JobLedger(self.config.explore)

    def known(self, index: int) -> bool:
        """Whether bucket `index`'s exact codec is decided (its nonzero share is not needed)."""
        b = self.buckets.get(index)
        return b is not None and bool(b.exact)

    def record(
        self, index: int, seconds: float, ran: Choice | None, nonzero: float, wire: float = 0.0
    ) -> None:
        """This rank's measurement of bucket `index` this step: the seconds its path took
        (`ran` None: the switch path fell back, agreed), its nonzero share and the wire
        density the switch path sent."""
        self.costs[index] = seconds
        self.nonzero[index] = nonzero
        self.wires[index] = wire
        self.bucket(index).ran = ran

    def measurements(
        self, indices: Sequence[int], budgets: dict[int, float], iteration: float = 0.0
    ) -> np.ndarray:
        """This rank's numbers for `indices` packed for MAX over ranks (Measurements): the
        smallest cost (a rank that handed its bucket over early waits for the last one; the
        last one's time is the path's own), the smallest budget, the largest nonzero share
        and wire density, and the longest iteration (the step before)."""
        return Measurements(
            costs=np.array([self.costs.get(i, 0.0) for i in indices], np.float64),
            budgets=np.array([budgets.get(i, 0.0) for i in indices], np.float64),
            nonzero=np.array([self.nonzero.get(i, 1.0) for i in indices], np.float64),
            wires=np.array([self.wires.get(i, 0.0) for i in indices], np.float64),
            iteration=iteration,
        ).pack()

    def taken(self) -> Taken:
        """This step's paths and rule densities, for `decide` once its numbers are agreed
        (with lag 1, after the next step's choices were made)."""
        ran = {i: (b.ran, b.density) for i, b in self.buckets.items() if b.ran is not None}
        for b in self.buckets.values():
            b.ran = None
        return Taken(ran, self.epoch)

    def decide(
        self, indices: Sequence[int], agreed: np.ndarray, taken: Taken | None = None
    ) -> dict[int, str]:
        """The choices of the step `config.lag` steps after the next one, from a measured
        step's agreed vector and what it ran (`taken`; None: the buckets' own, lag 0);
        identical on every rank."""
        agreed_numbers = Measurements.from_agreed(agreed, len(indices))
        ran = taken.ran if taken is not None else self.taken().ran
        learn = not self.held and (taken is None or taken.epoch == self.epoch)
        if learn:
            self.ledger.settle(self.step - 1, agreed_numbers.iteration)
            self.ledger.costs(self.step, float(np.sum(agreed_numbers.costs)))
        for j, index in enumerate(indices):
            cost, budget = float(agreed_numbers.costs[j]), float(agreed_numbers.budgets[j])
            self.agreed[index] = (cost, budget)
            b = self.bucket(index)
            if not b.exact:
                b.exact = self._exact_for(float(agreed_numbers.nonzero[j]))
            what, density = ran.get(index, (None, b.density))
            if what is not None and learn:
                b.wire = float(agreed_numbers.wires[j])
                self._update(b, what, density, cost, budget)
        if learn:
            self._plan({i: self.bucket(i) for i in indices})
        out = {index: self.choice(index).label for index in indices}
        self._grant_lease(out)
        self._close_step(out)
        if log.isEnabledFor(logging.INFO):  # the text costs more than the decision
            log.info("auto step %d: %s", self.step, self._describe(out))
        return out

    def _close_step(self, out: dict[int, str]) -> None:
        """The step's choices join the history; its local measurements are spent."""
        self.costs.clear()
        self.nonzero.clear()
        self.wires.clear()
        self.history.append(out)
        self.step += 1

    def _grant_lease(self, out: dict[int, str]) -> None:
        """Settled on the host path (this step and the next all host, the switch measured,
        the host plan's steps faster than the switch plan's, no exploration pending): the
        next lease_len - 1 steps `skip` the decision; the length doubles with each such
        decision in a row up to `config.lease`, else is 1. A decision from numbers older
        than the last lease (lag 1) grants none: chained on old numbers, leases would see
        a slowed link two leases late. Agreed state only: every rank skips alike."""
        if self.stale > 0:  # its numbers predate the lease (lag 1): wait for fresh ones
            self.stale -= 1
            self.lease = 0
            return
        last = self.history[-1] if self.history else {}
        host, switch = self.ledger.median(HOST_PLAN), self.ledger.median(SWITCH_PLAN)
        settled = (
            not self.held
            and self.ledger.exploring is None
            and host is not None
            and switch is not None
            and host <= switch
            and all(c == HOST for c in (*out.values(), *last.values()))
            and all(self.bucket(i).costs.has_switch() for i in out)
        )
        self.lease_len = min(2 * self.lease_len, self.config.lease) if settled else 1
        self.lease = self.lease_len - 1

    def skip(self) -> dict[int, str]:
        """A leased step's end, in place of `decide`: the same choices run again; nothing
        is agreed or learned, the ledger earns its exploration credit as on a host step."""
        if self.lease <= 0 or not self.history:
            raise RuntimeError("auto: skip() outside a lease")
        self.lease -= 1
        self.stale = self.config.lag
        self.ledger.skip(self.step - 1)
        self.ledger.plan(self._planned_step(), HOST_PLAN, 0.0)
        for b in self.buckets.values():
            b.ran = None
        out = dict(self.history[-1])
        self._close_step(out)
        return out

    def _planned_step(self) -> int:
        """The step that the choices made now run in (`lag` steps after the next one)."""
        return self.step + 1 + self.config.lag

    def _describe(self, out: dict[int, str]) -> str:
        return (
            ", ".join(
                f"bucket {i} {self.agreed[i][0] * 1e3:.1f}/{self.agreed[i][1] * 1e3:.1f} ms "
                f"w {self.bucket(i).wire:.3f} -> {c}"
                for i, c in out.items()
            )
            + f" (credit {self.ledger.credit * 1e3:.0f} ms)"
        )

    def _exact_for(self, nonzero: float) -> str:
        """A mostly-zero bucket takes the lossless codec, a dense one fixed point (when
        both are listed; else the first listed)."""
        exact = self.config.exact
        want = "lossless" if nonzero < self.config.sparse_below else "fixed_point"
        return want if want in exact else exact[0]

    # -- the plan ------------------------------------------------------------------------

    def _plan(self, buckets: dict[int, BucketControl]) -> None:
        """The next step's plan (JobLedger.plan, from what the buckets' switch arms are
        expected to leave exposed beyond their budgets, against their host path's); when
        the ledger runs the host plan instead, every bucket takes the host path this step
        (keeping the density its next probe will try)."""
        proposed = SWITCH_PLAN if any(not b.on_host for b in buckets.values()) else HOST_PLAN
        delta = 0.0  # what the switch arms are expected to leave exposed beyond the host's
        floor = 0.0  # the host path's bucket costs (0 while one is unknown)
        for i, b in buckets.items():
            host, budget = b.costs.costs.get(HOST), self.agreed.get(i, (0.0, 0.0))[1]
            if host is None:
                floor = -math.inf
                continue
            floor += host.seconds
            if not b.on_host:
                switch = self._predicted(b, b.density)
                delta += max(0.0, switch - budget) - max(0.0, host.seconds - budget)
        config = tuple(sorted((i, self.choice(i).label) for i in buckets))
        step = self._planned_step()
        if self.ledger.plan(step, proposed, delta, max(0.0, floor), config) == HOST_PLAN:
            for b in buckets.values():
                b.on_host = True

    def _may_explore(self, b: BucketControl, expected: float, incumbent: float) -> bool:
        """Whether a bucket may run one step on another arm than the cheapest known: the
        first measurement of the switch always; else when it is expected to win or the
        ledger pays for it."""
        return not b.costs.has_switch() or self.ledger.affords(expected - incumbent)

    # -- the rule ------------------------------------------------------------------------

    def _update(
        self, b: BucketControl, ran: Choice, density: float, cost: float, budget: float
    ) -> None:
        """Store what ran (at rule density `density`), then choose the next arm: the rule
        acts on the density measured, so with lag 1 an overrun measured twice at one
        density compresses once (no overshoot from a decision already in flight)."""
        b.costs.add(arm_key(ran), cost, b.wire, self.step)
        if ran.method == HOST:
            self._after_host(b, cost, budget)
        else:
            self._after_switch(b, density, cost, budget)
        b.incumbent = b.costs.best(self.step)

    def _after_host(self, b: BucketControl, host: float, budget: float) -> None:
        """On the host path: back to the switch when a fresh switch cost is lower, or when
        the ledger pays for a probe at the density the cost model expects to win."""
        best = b.costs.best(self.step, switch_only=True)
        if best is not None and best[1] < host:
            b.density, b.on_host = float(best[0]), False
            return
        b.density = 1.0 if host <= budget else self._probe_density(b, host)
        if self._may_explore(b, self._predicted(b, b.density), host):
            b.on_host = False

    def _after_switch(self, b: BucketControl, d: float, cost: float, budget: float) -> None:
        """On the switch path at density d: hidden, DC2's additive decrease on slack;
        overrun, the host path when it hides the bucket exactly or is measured cheaper,
        else multiplicative increase of compression while compressing pays."""
        c = self.config
        if cost <= budget:
            if cost < c.slack * budget and d < 1.0:
                b.density = _snap(d + c.decrease)
            return
        host = b.costs.fresh(HOST, self.step)
        if host is None:  # never measured, or stale: measure it (when the ledger pays)
            stale = b.costs.costs.get(HOST)
            if stale is None or self._may_explore(b, stale.seconds, cost):
                b.on_host = True
                return
            host = stale.seconds
        was = b.costs.fresh(key_of(min(1.0, d * c.increase)), self.step) if d < 1.0 else None
        paid = was is None or cost <= c.pays * was
        if not paid:  # compressing to d did not pay
            b.floor, b.floor_step = min(1.0, d * c.increase), self.step
        finer = _snap(max(self._floor(b), min(d, self._wire(b, d)) / c.increase))
        expected = self._predicted(b, finer)
        compress = paid and self._wire(b, finer) < self._wire(b, d) and min(cost, expected) < host
        if host <= budget:  # the host path hides it, exactly: no compression needed
            b.on_host, b.density = True, 1.0
        elif compress and self._may_explore(b, expected, min(cost, host)):
            b.density = finer  # overrun: compress more (MI) while it pays and can win
        elif cost <= host:
            best = b.costs.best(self.step, switch_only=True)
            b.density = float(best[0]) if best is not None else d
        else:  # the host path is cheaper: it runs until the ledger pays for a probe
            b.on_host, b.density = True, self._probe_density(b, host)

    def _floor(self, b: BucketControl) -> float:
        """The lowest density worth trying: min_density, or where compressing stopped
        paying (while that measurement is fresh)."""
        c = self.config
        return max(c.min_density, b.floor if self.step - b.floor_step < c.fresh_steps else 0.0)

    def _wire(self, b: BucketControl, density: float) -> float:
        """The wire density of the codec chosen at `density`: the exact codec's as it was
        measured (lossless on a sparse bucket sends a few percent), else the lossy
        codec's own."""
        if density >= 1.0:
            return b.costs.exact_wire()
        return self.codec_at(density, b.exact).density

    def _predicted(self, b: BucketControl, density: float) -> float:
        """The switch's expected cost at `density`: the last agreed cost of the codec
        chosen there, else the cost model's at its wire density."""
        choice = self.codec_at(density, b.exact)
        return b.costs.predicted(arm_key(choice), self._wire(b, density))

    def _probe_density(self, b: BucketControl, host: float) -> float:
        """The least compression (largest density on the ladder 1, 1/increase, ... down to
        the floor, keeping the densities that send fewer cells than the exact codec)
        expected to beat the host path by the `pays` margin; when none is, the cheapest
        expected (the least compression among those within that margin)."""
        c = self.config
        ladder: list[float] = [1.0]
        d = 1.0 / c.increase
        while d >= self._floor(b) - 1e-12:
            if self._wire(b, d) < self._wire(b, ladder[-1]):
                ladder.append(_snap(d))
            d /= c.increase
        expected = [(x, self._predicted(b, x)) for x in ladder]
        winners = [x for x, e in expected if e <= c.pays * host]
        if winners:
            return max(winners)
        low = min(e for _, e in expected)
        return max(x for x, e in expected if e * c.pays <= low)
