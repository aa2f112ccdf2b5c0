"""What the paths cost, as codec="auto" has measured them: per bucket the agreed seconds and
wire density (cells sent per dense cell) of every arm tried (the host path, the switch at
each density), how fresh they are, and a linear model of the switch's cost in its wire
density for the densities not tried yet; per job the time of whole steps by plan and the
exploration credit (homagg/worker/auto/control.py decides from these)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

HOST = "host"  # the process group's all_reduce: chosen when the switch path cannot win


def key_of(density: float) -> str:
    """A switch arm's key: the density its codec is chosen at, 6 significant digits."""
    return f"{density:.6g}"


# Samples kept per arm and per plan; a change of conditions (a slow link, a loaded switch)
# is believed once CONFIRM samples in a row lie beyond a factor CHANGE of the others'
# median on the same side: one outlier (a stalled rank, a noisy neighbour) moves a median
# of five only a little and never replaces what was measured.
WINDOW, CHANGE, CONFIRM = 5, 2.0, 2


def add_sample(samples: deque[tuple[int, float]], step: int, x: float) -> None:
    """Append (step, x) to a window of samples; CONFIRM samples in a row beyond a factor
    CHANGE of the earlier ones' median, on the same side, drop the earlier ones."""
    samples.append((step, x))
    if len(samples) <= CONFIRM:
        return
    recent = [v for _, v in list(samples)[-CONFIRM:]]
    median = statistics.median(v for _, v in list(samples)[:-CONFIRM])
    if all(v > CHANGE * median for v in recent) or all(v * CHANGE < median for v in recent):
        for _ in range(len(samples) - CONFIRM):
            samples.popleft()


def median_of(samples: deque[tuple[int, float]]) -> float:
    """The median of a window's values (pure Python: numpy's costs ~100x more on five
    values, on the communication thread, every step)."""
    return float(statistics.median(v for _, v in samples))


def fit_line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """(fixed, slope) of the least-squares line through (wire, seconds) points, both kept
    non-negative (a cost that grows with what is sent); one wire density: proportional."""
    if not pts:
        return 0.0, 0.0
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if max(x for x, _ in pts) - min(x for x, _ in pts) < 1e-9:
        return 0.0, my / max(pts[0][0], 1e-9)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return max(0.0, my - slope * mx), max(0.0, slope)


@dataclass
class Cost:
    """An arm's recent agreed costs (seconds, by step; its cost is their median), and the
    wire density it last sent (switch arms; a lossless codec on a sparse bucket sends far
    fewer cells than its nominal density 1)."""

    samples: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    wire: float = 0.0

    @property
    def seconds(self) -> float:
        """The arm's cost: the median of its recent samples."""
        return median_of(self.samples)

    @property
    def step(self) -> int:
        """The step it was last measured in."""
        return self.samples[-1][0]


@dataclass
class ArmCosts:
    """One bucket's costs by arm key (HOST or key_of(density))."""

    fresh_steps: int = 10
    costs: dict[str, Cost] = field(default_factory=dict)
    _model: tuple[float, float] | None = field(default=None, repr=False)  # model()'s fit

    def add(self, key: str, seconds: float, wire: float, step: int) -> None:
        """A new agreed measurement of arm `key` (add_sample's rule: older samples stay
        until a change is confirmed, however long ago they were taken)."""
        got = self.costs.setdefault(key, Cost())
        add_sample(got.samples, step, seconds)
        got.wire = wire
        self._model = None

    def cost(self, key: str) -> float:
        """Arm `key`'s cost: its median, but a switch arm's latest sample at once when it
        lies beyond a factor CHANGE above it (a rise not yet confirmed counts against the
        switch, never for it: the host path is the safe side of a doubt)."""
        got = self.costs[key]
        last = got.samples[-1][1]
        return last if key != HOST and last > CHANGE * got.seconds else got.seconds

    def fresh(self, key: str, step: int) -> float | None:
        """The arm's cost if measured within the last fresh_steps steps."""
        got = self.costs.get(key)
        if got is None or step - got.step >= self.fresh_steps:
            return None
        return self.cost(key)

    def best(self, step: int, switch_only: bool = False) -> tuple[str, float] | None:
        """(key, cost) of the cheapest arm with a fresh cost, if any."""
        keys = [k for k in self.costs if not (switch_only and k == HOST)]
        known = [(k, s) for k in keys if (s := self.fresh(k, step)) is not None]
        return min(known, key=lambda x: x[1]) if known else None

    def has_switch(self) -> bool:
        """Whether the switch path was ever measured."""
        return any(k != HOST for k in self.costs)

    def exact_wire(self) -> float:
        """The wire density the exact codec sent (1 before it was measured)."""
        got = self.costs.get(key_of(1.0))
        return got.wire if got is not None and got.wire > 0 else 1.0

    def model(self) -> tuple[float, float]:
        """(fixed, per unit of wire density) of the switch's cost, fitted by least squares
        to every switch arm's cost; one wire density known: proportional. Kept until the
        next `add` (the rule asks for it once per density it weighs)."""
        if self._model is None:
            pts = [(c.wire or float(k), self.cost(k)) for k, c in self.costs.items() if k != HOST]
            self._model = fit_line(pts)
        return self._model

    def predicted(self, key: str, wire: float) -> float:
        """An arm's expected cost: its measured cost, else the model's at `wire`."""
        if key in self.costs:
            return self.cost(key)
        fixed, slope = self.model()
        return fixed + slope * wire


HOST_PLAN, SWITCH_PLAN = HOST, "switch"  # every bucket on the host path; some on the switch


@dataclass
class JobLedger:
    """The job's view across buckets. A bucket's cost leaves out what the switch path
    costs the rest of the step (the ranks' synchronisation, CPU taken from compute), so
    whole steps are measured too: a step's time minus its buckets' costs is the rest of
    the step, and the switch plan's rest minus the host plan's is the switch's
    **overhead**. A plan is expected to take (host plan's rest) + (overhead, if it uses
    the switch) + (its buckets' expected costs); one expected slower than the host plan
    runs only as an exploration, paid from a credit: every step earns `explore` of its
    time, and an exploration slower than the host plan's median pays its excess; each
    exploration in a row that lost doubles the credit the next one needs; the credit is
    capped at what `refresh` host steps earn (or the price of the exploration declined
    last, when more), so a long quiet spell buys no burst. The host
    plan's steps count while they are at most `refresh` steps old; a switch plan runs one
    host step to measure it again when they are not."""

    explore: float = 0.1
    refresh: int = 20
    credit: float = 0.0
    times: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)  # (step, s)
    rests: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)  # - buckets
    kinds: dict[int, str] = field(default_factory=dict)  # planned steps, time not known yet
    configs: dict[int, Hashable] = field(default_factory=dict)  # their switch plans' choices
    last_switch: tuple[Hashable, float] | None = None  # the latest switch step: choices, s
    wanted: float = 0.0  # the price of the exploration declined last
    sums: dict[int, float] = field(default_factory=dict)  # their buckets' agreed costs
    last_sum: float = 0.0  # the latest step's buckets' agreed cost (replayed by `skip`)
    exploring: int | None = None  # the step of the exploration not settled yet
    failed: int = 0  # explorations in a row that were slower than the host plan
    now: int = 0  # the latest step planned

    def median(self, plan: str, of: str = "times") -> float | None:
        """The median step time (or rest) of the plan's recent steps, if any (the host
        plan's: only while its latest step is at most `refresh` steps old)."""
        got = getattr(self, of).get(plan)
        if not got or (plan == HOST_PLAN and self.now - got[-1][0] > self.refresh):
            return None
        return median_of(got)

    def overhead(self) -> float:
        """The switch plan's rest minus the host plan's (0 until both are measured)."""
        switch, host = self.median(SWITCH_PLAN, "rests"), self.median(HOST_PLAN, "rests")
        return max(0.0, switch - host) if switch is not None and host is not None else 0.0

    def costs(self, step: int, seconds: float) -> None:
        """Step `step`'s buckets cost `seconds` together (agreed, known at its end)."""
        self.sums[step] = self.last_sum = seconds

    def settle(self, step: int, seconds: float) -> None:
        """Step `step` took `seconds` (agreed; known one step later): it earns `explore` of
        it; an exploration pays its excess over the host plan's median (a switch step that
        was expected to win pays nothing: when it lost, its choices run again only as an
        exploration, `excess`); its time and rest join its plan's (the first step, a
        warm-up, does not)."""
        plan, buckets = self.kinds.pop(step, None), self.sums.pop(step, None)
        config = self.configs.pop(step, None)
        host = self.median(HOST_PLAN)
        explored = self.exploring == step
        if explored:
            self.exploring = None
            lost = host is not None and seconds > host
            self.failed = self.failed + 1 if lost else 0
        if seconds <= 0.0 or plan is None:
            return
        self._earn(seconds, max(0.0, seconds - host) if explored and host is not None else 0.0)
        if plan == SWITCH_PLAN and step > 0:
            self.last_switch = (config, seconds)
        if step > 0:
            self._add(self.times, plan, step, seconds)
            if buckets is not None:  # decided without learning (a release): no rest
                self._add(self.rests, plan, step, seconds - buckets)

    def skip(self, step: int) -> None:
        """Step `step` ran the host plan under a lease (no agreed numbers): it earns `explore`
        of the host plan's median step and joins no median; the next step's buckets are
        taken to cost what the last agreed ones did (a lease holds only while the host
        plan is settled), so the step after the lease still measures the host plan's rest."""
        self.kinds.pop(step, None)
        self.sums.pop(step, None)
        self.configs.pop(step, None)
        self.sums[step + 1] = self.last_sum
        host = self.median(HOST_PLAN)
        if host is not None:
            self._earn(host)

    def _earn(self, seconds: float, paid: float = 0.0) -> None:
        """A step of `seconds` earns `explore` of it, less what its exploration `paid`."""
        self.credit += self.explore * seconds - paid
        host = self.median(HOST_PLAN)
        if host is not None:  # no burst after a quiet spell, but the next price is reachable
            self.credit = min(self.credit, max(self.explore * self.refresh * host, self.wanted))

    @staticmethod
    def _add(table: dict[str, deque[tuple[int, float]]], plan: str, step: int, x: float) -> None:
        """A plan's new sample (add_sample's rule)."""
        add_sample(table.setdefault(plan, deque(maxlen=WINDOW)), step, x)

    def plan(
        self,
        step: int,
        proposed: str,
        delta: float,
        host_floor: float = 0.0,
        config: Hashable = None,
    ) -> str:
        """The plan step `step` runs, given the buckets' proposal, its expected bucket
        costs minus the host path's (`delta`) and the host path's bucket costs together
        (`host_floor`: a host step takes at least that): the switch plan runs when
        expected no slower than the host plan (`excess` <= 0), else as an
        exploration when the credit covers the excess (one unsettled exploration at a
        time), else the host plan does. Without a recent host step, once the switch plan
        ran, host steps run until one is measured, unless the switch plan's steps are
        already faster than `host_floor` (the host plan cannot win). `config`: the
        proposed switch plan's choices (excess)."""
        self.now = step
        kind = proposed
        switch = self.median(SWITCH_PLAN)
        if proposed == SWITCH_PLAN and self.median(HOST_PLAN, "rests") is None:
            tried = SWITCH_PLAN in self.rests or SWITCH_PLAN in self.kinds.values()
            if tried and not (switch is not None and switch <= host_floor):
                kind = HOST_PLAN  # measure the host plan's step first
        elif proposed == SWITCH_PLAN and self.excess(delta, config) > 0.0:
            price = self.excess(delta, config) * 2 ** min(self.failed, 6)  # backs off
            if self.exploring is None and self.credit >= price:
                self.exploring, self.wanted = step, 0.0
            else:
                kind, self.wanted = HOST_PLAN, price
        self.kinds[step] = kind
        if kind == SWITCH_PLAN:
            self.configs[step] = config
        return kind

    def excess(self, delta: float, config: Hashable = None) -> float:
        """What a switch step with choices `config` is expected to cost beyond a host
        step: overhead + delta, or, when more and the latest switch step had the same
        choices, what it took beyond the host plan's median or its latest step, whichever
        is more (a whole step overrules the buckets' costs, one of which may be an
        outlier)."""
        expected = self.overhead() + delta
        host = self.median(HOST_PLAN)
        if self.last_switch is not None and self.last_switch[0] == config and host is not None:
            host = max(host, self.times[HOST_PLAN][-1][1])  # a rise not confirmed yet counts
            return max(expected, self.last_switch[1] - host)
        return expected

    def affords(self, excess: float) -> bool:
        """Whether a bucket may try an arm expected to cost `excess` more: one expected to
        win always (the plan is checked on whole steps), else when the credit covers it."""
        return excess < 0.0 or self.credit >= excess
