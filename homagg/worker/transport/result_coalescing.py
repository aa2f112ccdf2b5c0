"""Interrupt coalescing for a rank whose results trickle in: a switch that answers one packet
at a time (BMv2, a few thousand packets/s) wakes the rank once a result, and every wake-up
costs the same Python and system calls however few results it finds (~100-180 us of CPU
a result on 2 shared cores, taken from the switch sharing them). When the last look found
fewer than `batch` results and many more are due, the rank waits about as long as the
results' measured spacing says `batch` take, at most `max_nap_s` and never past a timer's
deadline, before it looks again: fewer, fuller batches, as a NIC's interrupt moderation
does. Where results come in bursts (the eBPF target: a chunk's results leave together once
every rank contributed) each look finds a burst and no nap is taken; with fewer chunks in
flight than a batch, a call's tail is looked at result by result."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BATCH = 8  # results a look should find when many are due
MAX_NAP_S = 0.001  # the longest wait before a look: a result's delay at most this much
SMOOTHING = 1 / 8  # of the spacing's moving average (as RFC 6298's SRTT)


@dataclass
class ResultCoalescing:
    """The spacing of one transport's results and what the last look found."""

    batch: int = BATCH
    max_nap_s: float = MAX_NAP_S
    spacing_s: float = 0.0  # smoothed seconds between results (0: not measured yet)
    last_at: float = -math.inf
    last_found: int = 0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)  # tests: a clock's

    def started(self) -> None:
        """A new call's exchange: the time since the last result (the codec's, the step's)
        is no spacing of results."""
        self.last_at, self.last_found = -math.inf, 0

    def found(self, results: int, now: float) -> None:
        """A look at `now` found `results` results of the call."""
        if results <= 0:
            return
        if self.last_at > -math.inf:
            spacing = max(0.0, now - self.last_at) / results
            self.spacing_s += (spacing - self.spacing_s) * (
                1.0 if self.spacing_s == 0 else SMOOTHING
            )
        self.last_at, self.last_found = now, results

    def nap(self, in_flight: int, wait: float) -> float:
        """Seconds to wait before the next look (0: look now): only while a batch is in
        flight and the last look found less than one."""
        if self.last_found >= self.batch or in_flight < self.batch or self.spacing_s <= 0:
            return 0.0
        return max(0.0, min(wait, self.max_nap_s, self.spacing_s * (self.batch - self.last_found)))
