"""The transport's congestion window: how many chunks a worker keeps in flight, never more
than its pool (the pool stays the slots' bound, the window only paces below it).

TCP's rules (RFC 5681) counted in chunks: the window starts at INITIAL_WINDOW, grows by one
chunk per chunk answered while below the slow-start threshold (slow start: it doubles per
round trip), then by 1/window per chunk answered (additive increase: one chunk per round
trip). A loss halves it (multiplicative decrease, not below FLOOR) and sets the threshold
there, at most once per window of chunks: a loss of a chunk sent before the last halving
belongs to the window already halved (NewReno's recovery point, here a stream index). A
loss is a retransmission timeout of a chunk that a later chunk's answer skipped, or a chunk
passed over by `fast_resend_after` later answers (fast retransmit: RFC 5681 halves there
too). A timeout in silence (nothing answered since the chunk's timer started: the whole
pool late, a slow peer or the scheduler) is no loss: measured on the eBPF target on 2
loaded cores, such timeouts were spurious (the switch had every contribution), and halving
on them cut the window for nothing (docs/performance.md, "The congestion window"). A
burst of a whole pool into a shared queue (the socket's, a veth's, a shaper's) overruns
it; the window lets the burst grow only as fast as the answers come back. On both I/O
paths the same object answers, chunk by chunk or batch by batch, with the same result
(`answered(n)` is n answers of one chunk).
Chosen by TransportConfig.congestion_window, else HOMAGG_CONGESTION_WINDOW, else on.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from homagg.environment import CONGESTION_WINDOW_ENV

INITIAL_WINDOW = 16  # chunks in flight before the first answer (TCP's is 10 segments)
FLOOR = 4  # the smallest window a halving leaves (chunks)
SWITCHES = {"1": True, "on": True, "0": False, "off": False}


def resolve_congestion_window(asked: bool | None = None) -> bool:
    """Whether the window paces the transport: `asked` (a TransportConfig's), else the
    environment's, else on; a ValueError that names the choices for anything else."""
    if asked is not None:
        return asked
    value = os.environ.get(CONGESTION_WINDOW_ENV, "").strip().lower()
    if not value:
        return True
    if value not in SWITCHES:
        raise ValueError(
            f"{CONGESTION_WINDOW_ENV} must be one of {', '.join(SWITCHES)}, not {value!r}"
        )
    return SWITCHES[value]


@dataclass
class CongestionWindow:
    """One transport's window (chunks), kept across its calls. `enabled` False: the pool
    alone bounds what is in flight (the former behaviour)."""

    ceiling: int  # the pool: never more in flight
    enabled: bool = True
    initial: int = INITIAL_WINDOW
    floor: int = FLOOR
    cwnd: float = field(init=False)
    ssthresh: float = math.inf
    halvings: int = 0
    recover: int = -1  # a loss of a chunk (stream index) below it halves nothing

    def __post_init__(self) -> None:
        if self.ceiling < 1 or self.initial < 1 or self.floor < 1:
            raise ValueError(
                "a congestion window's ceiling (the pool), initial window and floor must be "
                f">= 1, not {self.ceiling}, {self.initial}, {self.floor}"
            )
        self.floor = min(self.floor, self.ceiling)
        self.cwnd = float(min(self.ceiling, max(self.floor, self.initial)))

    @property
    def limit(self) -> int:
        """How many chunks may be in flight now: min(pool, window), at least one."""
        if not self.enabled:
            return self.ceiling
        return max(1, min(self.ceiling, int(self.cwnd)))

    def answered(self, n: int = 1) -> None:
        """n chunks were answered: slow start below the threshold, then additive increase
        (exactly n answers of one chunk each, so both I/O paths agree)."""
        if not self.enabled or n <= 0:
            return
        if self.cwnd < self.ssthresh:  # slow start: one chunk more per answer
            room = self.ssthresh - self.cwnd
            step = n if math.isinf(room) else min(n, math.ceil(room))
            self.cwnd += step
            n -= step
        while n > 0 and self.cwnd < self.ceiling:  # additive increase: 1/cwnd per answer
            self.cwnd += 1.0 / self.cwnd
            n -= 1
        self.cwnd = min(self.cwnd, float(self.ceiling))

    def lost(self, chunk: int, next_chunk: int) -> bool:
        """Chunk `chunk` (stream index) was lost while `next_chunk` is the next to go: halve
        the window unless this window was halved already; returns whether it was."""
        if not self.enabled or chunk < self.recover:
            return False
        self.ssthresh = self.cwnd = max(float(self.floor), self.cwnd / 2)
        self.halvings += 1
        self.recover = next_chunk
        return True

    def realigned(self, next_chunk: int) -> None:
        """The stream resumes at `next_chunk` (the ranks' agreed counter after a fallback):
        the recovery point may not lie beyond it."""
        self.recover = min(self.recover, next_chunk)
