"""The retransmission timeout from measured round trips (RFC 6298), bounded.

A chunk's round trip runs from its first send to its result, so it includes the switch's
queueing and the wait for the slowest worker's contribution: exactly what a timeout must
not fire on. SRTT and RTTVAR follow RFC 6298 section 2 (alpha 1/8, beta 1/4, K = 4);
Karn's rule (section 3): chunks that were retransmitted give no sample. An expiry backs the
timeout off (section 5.5) until the next sample (5.7), and a chunk's own retries double it
too: a chunk's timeout is RTO x 2^max(retries, back-offs), bounded by the maximum (when a
pool waits in silence the transport resends its oldest chunk at each expiry, so that
chunk's retries and the back-offs count the same expiries).
RFC 6298 has one timer, so it backs off once per expiry; here every chunk has its own
deadline, and one expiry event is every timeout of chunks whose timers were already running
at the last back-off: a burst of k lost chunks doubles the timeout once, not 2^k times.
The bounds keep one spurious sample from making the transport either hammer the switch or
sit idle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 1 / 8
BETA = 1 / 4
K = 4
MAX_DOUBLINGS = 30  # 2^30 x any timeout is far above the maximum


@dataclass
class RetransmissionTimer:
    """SRTT/RTTVAR state of one transport; `rto` is the first try's timeout."""

    initial: float = 0.02  # before the first sample (RFC 6298 says 1 s; a LAN switch is < 1 ms)
    minimum: float = 0.005
    maximum: float = 0.5
    adaptive: bool = True  # False: the fixed `initial` (the former behaviour, for comparisons)
    srtt: float | None = None
    rttvar: float = 0.0
    samples: int = 0
    backoff: int = 0  # expiry events since the last sample (adaptive only)
    backed_off_at: float = -math.inf  # when the last back-off happened (monotonic seconds)

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                "retransmission timeouts must satisfy 0 < minimum <= initial <= maximum, "
                f"not {self.minimum}, {self.initial}, {self.maximum}"
            )

    @property
    def rto(self) -> float:
        """The timeout of a chunk's first try."""
        if not self.adaptive or self.srtt is None:
            return self.initial
        return min(self.maximum, max(self.minimum, self.srtt + K * self.rttvar))

    def timeout(self, tries: int) -> float:
        """The timeout after `tries` retransmissions of a chunk: rto * 2^max(tries, backoff),
        bounded."""
        return min(self.maximum, self.rto * 2.0 ** min(max(tries, self.backoff), MAX_DOUBLINGS))

    def timeouts(self, tries: np.ndarray) -> np.ndarray:
        """`timeout` of many chunks at once."""
        exponent = np.minimum(np.maximum(tries, self.backoff), MAX_DOUBLINGS)
        return np.minimum(self.maximum, self.rto * 2.0**exponent)

    def timed_out(self, sent: float, now: float) -> None:
        """A chunk whose timer started at `sent` timed out at `now`: back off every chunk's
        timeout until the next sample, once per expiry event (a timer that ran at the last
        back-off belongs to that event)."""
        if self.adaptive and sent >= self.backed_off_at:
            self.backoff = min(self.backoff + 1, MAX_DOUBLINGS)
            self.backed_off_at = now

    def sample(self, rtt: float) -> None:
        """One measured round trip of a chunk sent once (Karn: never of a retransmitted one)."""
        if rtt < 0:
            raise ValueError(f"a round trip cannot be negative ({rtt})")
        self.samples += 1
        self.backoff = 0
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
            return
        self.rttvar = (1 - BETA) * self.rttvar + BETA * abs(self.srtt - rtt)
        self.srtt = (1 - ALPHA) * self.srtt + ALPHA * rtt
