"""A slow rank is not a dead path: what a rank does once a chunk has spent its retry budget.

A chunk stays unanswered either because a peer has not contributed yet (a checkpoint write,
a slow data loader) or because the switch path or a peer is gone. The switch drops a
resent contribution of an open round silently (DUPLICATE), so the chunk's own resends
prove nothing; but a resend of a chunk whose round is complete comes back as a resent
result. The probe is this rank's contribution to its newest completed chunk d. Its slot
copy is overwritten only by chunk d + 2S; while d >= j - S, where j is the oldest chunk
the rank waits on, ranks send in order and no rank sends d + 2S before chunk j completed
(pool rule), and once j completed j's own resends come back. Either way an answer proves
the path. The peers are proven by the agent: its heartbeats are answered only while
the controller holds every rank's lease (an expired lease ends the job). The rank keeps
waiting while both hold, up to `max_wait` (a rank that left cleanly is not reported to its
peers), and gives up at once when either fails. While the controller cannot be reached
nothing proves or disproves the peers: the wait goes on only as long as the controller
would have waited on a silent peer (`peers_unproven`, the agent's: a lease and a heartbeat
interval since its last answer), so a peer that dies during a controller outage stalls the
step for about a lease, not for `max_wait`.

A rank that gives up a call for a reason of its own (its path failed, it waited `max_wait`)
tells the others through the controller (`tell`: the agent's next heartbeat, sent at once),
and the others learn it from their heartbeat answers (`told`): none of them can complete
that call without it, so a wait on it, or on any later chunk, ends at the next timer check
instead of after `max_wait` (its heartbeats are still answered: it is alive). A give-up
before `aligned_from`, the stream index the ranks last agreed to resume at, is of a call
the ranks have already given up together, and is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from homagg.control.job_record import GaveUp
from homagg.wire.header import marked_retx

PeersProblem = Callable[[], str]  # "" while every peer is believed alive, else why not
Told = Callable[[], GaveUp | None]  # the newest give-up another rank told (None: none)
Tell = Callable[[GaveUp], None]  # tells the other ranks that this one gave up a call


@dataclass
class StragglerWait:
    """The probe and the evidence of one transport; `peers_problem` None: no evidence of the
    peers, so a spent retry budget ends the wait at once (the former behaviour);
    `peers_unproven` ("" while something still vouches for the peers) None: the peers count
    as proven for as long as `peers_problem` says nothing."""

    dead_path_s: float = 3.0  # probing without any datagram from the switch this long: dead
    max_wait: float = 120.0  # the longest wait for one chunk (from its first send)
    peers_problem: PeersProblem | None = None
    peers_unproven: PeersProblem | None = None
    told: Told | None = None
    aligned_from: int = 0  # the stream index the ranks last agreed to resume at
    probe_index: int = -1  # stream index of the newest completed chunk (-1: none yet)
    probe_row: np.ndarray | None = None  # this rank's contribution to it (payload bytes)
    last_heard: float = float("-inf")  # when the switch last sent this rank anything
    probing_since: float | None = None  # when this wait began probing (None: not waiting)
    last_probe: float = float("-inf")
    probes: int = 0

    def heard(self, now: float) -> None:
        """A datagram came from the switch: the path works."""
        self.last_heard = now

    def progressed(self, index: int, payload: np.ndarray) -> None:
        """Chunk `index` (stream index) completed with this rank's `payload`: a wait ends."""
        self.probing_since = None
        if index > self.probe_index:
            self.probe_index, self.probe_row = index, payload

    def keep_probe(self) -> None:
        """Copy the probe out of the call's payloads (so that they can be freed)."""
        if self.probe_row is not None:
            self.probe_row = self.probe_row.copy()

    def probe_for(self, oldest_open: int, pool_size: int) -> bytes | None:
        """The probe while `oldest_open` waits, or None when no completed chunk is surely
        still held (the stream's first chunks, or after the ranks realigned their counters)."""
        if self.probe_row is None or not oldest_open - pool_size <= self.probe_index:
            return None
        return marked_retx(self.probe_row)

    def peers_gone(self) -> str:
        """Why the peers may be gone or will not complete this call ("" while the agent
        proves them, or without an agent): checked at every timeout, so a dead peer ends the
        wait within its lease, and a peer that gave up within a heartbeat interval."""
        problem = self.peers_problem() if self.peers_problem is not None else ""
        if problem:
            return f"a peer is gone or the job ended: {problem}"
        gave_up = self.told() if self.told is not None else None
        if gave_up is not None and gave_up.chunk >= self.aligned_from:
            return str(gave_up)
        return ""

    def stop_reason(self, now: float, waited: float, can_probe: bool) -> str:
        """Why the rank must stop waiting, for a reason of its own, for a chunk that spent its
        retry budget ("": keep waiting, and probe); `peers_gone` is checked before."""
        if self.peers_problem is None:
            return "no evidence that the peers are alive (no agent)"
        if not can_probe:
            return "no completed chunk to prove the switch path with"
        unproven = self.peers_unproven() if self.peers_unproven is not None else ""
        if unproven:
            return f"the controller is unreachable: {unproven}"
        if waited > self.max_wait:
            return f"waited {waited:.1f} s for a slow peer (at most {self.max_wait:g} s)"
        if self.probing_since is None:
            self.probing_since = now
        silent = now - max(self.last_heard, self.probing_since)
        if silent > self.dead_path_s:
            return (
                f"the switch path is gone: nothing from the switch for {silent:.1f} s "
                f"({self.probes} probes of chunk {self.probe_index} unanswered)"
            )
        return ""

    def should_probe(self, now: float, interval: float) -> bool:
        """At most one probe per `interval` while waiting."""
        if now - self.last_probe < interval:
            return False
        self.last_probe = now
        self.probes += 1
        return True
