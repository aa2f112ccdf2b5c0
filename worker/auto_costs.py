"""What the paths cost, as codec="auto" has measured them: per bucket the agreed seconds and
wire density (cells sent per dense cell) of every arm tried (the host path, the switch at
each density), how fresh they are, and a linear model of the switch's cost in its wire
density for the densities not tried yet; per job the time of whole steps by plan and the
exploration credit (worker/auto_control.py decides from these)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

HOST = "host"  # the process group's all_reduce: chosen when the switch path cannot win


def key_of(density: float) -> str:
    """A switch arm's key: the density its codec is chosen at, 6 significant digits."""
    return f"{density:.6g}"


@dataclass
class Cost:
    """An arm's agreed cost (seconds), the step it was last measured in, and the wire
    density it sent (switch arms; a lossless codec on a sparse bucket sends far fewer
    cells than its nominal density 1)."""

    seconds: float
    step: int
    wire: float = 0.0


@dataclass
class ArmCosts:
    """One bucket's costs by arm key (HOST or key_of(density))."""

    fresh_steps: int = 10
    costs: dict[str, Cost] = field(default_factory=dict)

    def add(self, key: str, seconds: float, wire: float, step: int) -> None:
        """A new agreed measurement: averaged with a fresh one of the same size (within a
        factor 2), else it replaces it (conditions changed)."""
        old = self.fresh(key, step)
        steady = old is not None and 0.5 * old <= seconds <= 2.0 * old
        value = 0.5 * (old + seconds) if steady and old is not None else seconds
        self.costs[key] = Cost(value, step, wire)

    def fresh(self, key: str, step: int) -> float | None:
        """The arm's cost if measured within the last fresh_steps steps."""
        got = self.costs.get(key)
        if got is None or step - got.step >= self.fresh_steps:
            return None
        return got.seconds

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
        to every switch arm's last cost; one wire density known: proportional."""
        pts = [(c.wire or float(k), c.seconds) for k, c in self.costs.items() if k != HOST]
        if not pts:
            return 0.0, 0.0
        xs = np.array([p[0] for p in pts])
        ys = np.array([p[1] for p in pts])
        if np.ptp(xs) < 1e-9:
            return 0.0, float(ys.mean() / max(xs[0], 1e-9))
        slope, fixed = np.polyfit(xs, ys, 1)
        return max(0.0, float(fixed)), max(0.0, float(slope))  # monotone, non-negative

    def predicted(self, key: str, wire: float) -> float:
        """An arm's expected cost: its last agreed cost, else the model's at `wire`."""
        got = self.costs.get(key)
        if got is not None:
            return got.seconds
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
    time, and a switch step slower than the host plan's median pays its excess; each
    exploration in a row that lost doubles the credit the next one needs. The host
    plan's steps count while they are at most `refresh` steps old; a switch plan runs one
    host step to measure it again when they are not."""

    explore: float = 0.1
    refresh: int = 20
    credit: float = 0.0
    times: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)  # (step, s)
    rests: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)  # - buckets
    kinds: dict[int, str] = field(default_factory=dict)  # planned steps, time not known yet
    sums: dict[int, float] = field(default_factory=dict)  # their buckets' agreed costs
    exploring: int | None = None  # the step of the exploration not settled yet
    failed: int = 0  # explorations in a row that were slower than the host plan
    now: int = 0  # the latest step planned

    def median(self, plan: str, of: str = "times") -> float | None:
        """The median step time (or rest) of the plan's recent steps, if any (the host
        plan's: only while its latest step is at most `refresh` steps old)."""
        got = getattr(self, of).get(plan)
        if not got or (plan == HOST_PLAN and self.now - got[-1][0] > self.refresh):
            return None
        return float(np.median([x for _, x in got]))

    def overhead(self) -> float:
        """The switch plan's rest minus the host plan's (0 until both are measured)."""
        switch, host = self.median(SWITCH_PLAN, "rests"), self.median(HOST_PLAN, "rests")
        return max(0.0, switch - host) if switch is not None and host is not None else 0.0

    def costs(self, step: int, seconds: float) -> None:
        """Step `step`'s buckets cost `seconds` together (agreed, known at its end)."""
        self.sums[step] = seconds

    def settle(self, step: int, seconds: float) -> None:
        """Step `step` took `seconds` (agreed; known one step later): it earns `explore` of
        it; a switch step pays its excess over the host plan's median; its time and rest
        join its plan's (the first step, a warm-up, does not)."""
        plan, buckets = self.kinds.pop(step, None), self.sums.pop(step, 0.0)
        host = self.median(HOST_PLAN)
        if self.exploring == step:
            self.exploring = None
            lost = host is not None and seconds > host
            self.failed = self.failed + 1 if lost else 0
        if seconds <= 0.0 or plan is None:
            return
        self.credit += self.explore * seconds
        if plan == SWITCH_PLAN and host is not None:
            self.credit -= max(0.0, seconds - host)
        if step > 0:
            self._add(self.times, plan, step, seconds)
            self._add(self.rests, plan, step, seconds - buckets)

    @staticmethod
    def _add(table: dict[str, deque[tuple[int, float]]], plan: str, step: int, x: float) -> None:
        """A plan's new sample; one more than a factor 2 from their median replaces the
        others (conditions changed: a slow link, a loaded switch)."""
        got = table.setdefault(plan, deque(maxlen=5))
        if got:
            median = float(np.median([v for _, v in got]))
            if not 0.5 * median <= x <= 2.0 * median:
                got.clear()
        got.append((step, x))

    def plan(self, step: int, proposed: str, delta: float, host_floor: float = 0.0) -> str:
        """The plan step `step` runs, given the buckets' proposal, its expected bucket
        costs minus the host path's (`delta`) and the host path's bucket costs together
        (`host_floor`: a host step takes at least that): the switch plan runs when
        expected no slower than the host plan (overhead + delta <= 0), else as an
        exploration when the credit covers the excess (one unsettled exploration at a
        time), else the host plan does. Without a recent host step, once the switch plan
        ran, host steps run until one is measured, unless the switch plan's steps are
        already faster than `host_floor` (the host plan cannot win)."""
        self.now = step
        kind = proposed
        switch = self.median(SWITCH_PLAN)
        if proposed == SWITCH_PLAN and self.median(HOST_PLAN, "rests") is None:
            tried = SWITCH_PLAN in self.rests or SWITCH_PLAN in self.kinds.values()
            if tried and not (switch is not None and switch <= host_floor):
                kind = HOST_PLAN  # measure the host plan's step first
        elif proposed == SWITCH_PLAN and self.overhead() + delta > 0.0:
            price = (self.overhead() + delta) * 2 ** min(self.failed, 6)  # backs off
            if self.exploring is None and self.credit >= price:
                self.exploring = step
            else:
                kind = HOST_PLAN
        self.kinds[step] = kind
        return kind

    def affords(self, excess: float) -> bool:
        """Whether a bucket may try an arm expected to cost `excess` more: one expected to
        win always (the plan is checked on whole steps), else when the credit covers it."""
        return excess < 0.0 or self.credit >= excess
