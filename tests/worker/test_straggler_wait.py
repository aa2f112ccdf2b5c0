"""A slow rank is not a dead path (no switch needed): a simulated two-rank switch whose other
rank pauses, goes away, or whose path dies; and local send errors classified as the path."""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest

from homagg.control.job_record import GaveUp
from homagg.wire.constants import CELLS_PER_PKT, Flag, Op
from homagg.wire.header import header_view
from homagg.wire.packer import parse_payloads
from homagg.worker.transport.switch_transport import (
    SwitchTransport,
    TransportConfig,
    TransportError,
)

FAST = dict(initial_timeout=0.01, max_timeout=0.05, max_retries=4, dead_path_s=0.3)


class PeerSwitch:
    """The switch as rank 0 sees it when rank 1 contributes chunk k at `peer_sends(k)`
    (seconds from now, None: never): a result once both are in, a resent result for a
    resend of a complete round, silence for an open one; `dead` silences everything."""

    def __init__(self, peer_sends) -> None:
        self.start = time.monotonic()
        self.peer_sends = peer_sends
        self.open: dict[int, bytes] = {}  # chunk -> rank 0's payload, round not complete
        self.complete: set[int] = set()
        self.replies: list[bytes] = []
        self.dead = False
        self.resends_of_complete = 0

    def send(self, payload: bytes) -> None:
        if self.dead:
            return
        h = parse_payloads(payload)[0][0]
        chunk = int(h["chunk"])
        if chunk in self.complete:
            self.resends_of_complete += int(h["flags"]) & Flag.RETX != 0
            self._reply(payload, Flag.RESULT | Flag.RETX)
        else:
            self.open[chunk] = payload

    def _reply(self, payload: bytes, flags: int) -> None:
        reply = np.frombuffer(payload, np.uint8).copy()
        header_view(reply)["flags"] = int(flags)
        self.replies.append(reply.tobytes())

    def recv(self, timeout: float) -> bytes | None:
        end = time.monotonic() + timeout
        while True:
            now = time.monotonic() - self.start
            for chunk in sorted(self.open):
                at = self.peer_sends(chunk)
                if not self.dead and at is not None and now >= at:
                    self._reply(self.open.pop(chunk), Flag.RESULT)
                    self.complete.add(chunk)
            if self.replies:
                return self.replies.pop(0)
            if time.monotonic() >= end:
                return None
            time.sleep(min(0.005, max(0.0, end - time.monotonic())))

    def close(self) -> None:
        pass


def transport(
    channel, peers_problem=lambda: "", peers_unproven=None, told=None, tell=None, **kw
) -> SwitchTransport:
    cfg = TransportConfig(job_id=7, rank=0, world_size=2, pool_size=4, **{**FAST, **kw})
    return SwitchTransport(
        cfg,
        channel,
        peers_problem=peers_problem,
        peers_unproven=peers_unproven,
        told=told,
        tell=tell,
    )


CELLS = np.arange(6 * CELLS_PER_PKT, dtype=np.int32)  # 6 chunks per call


def test_a_paused_peer_is_waited_for_without_a_storm():
    pause = 1.0
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else pause)
    t = transport(switch)
    np.testing.assert_array_equal(t.allreduce(Op.MAX, CELLS), CELLS)
    np.testing.assert_array_equal(t.allreduce(Op.MAX, CELLS), CELLS)  # no TransportError
    assert time.monotonic() - switch.start >= pause  # the peer's chunks came at `pause`
    assert switch.resends_of_complete > 0  # the path was probed
    # after the budget, one resend per chunk in flight and max_timeout, plus the probes
    per_chunk = FAST["max_retries"] + pause / FAST["max_timeout"] + 2
    assert t.stats.retransmissions <= 4 * per_chunk
    assert t.wait.probes <= pause / (FAST["max_timeout"] / 2) + 2


def test_a_dead_path_ends_the_wait():
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch)
    t.allreduce(Op.ADD, CELLS)
    switch.dead = True
    start = time.monotonic()
    with pytest.raises(TransportError, match="the switch path is gone"):
        t.allreduce(Op.ADD, CELLS)
    assert time.monotonic() - start < 2.0


def test_a_gone_peer_ends_the_wait():
    gone = {"why": ""}
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch, peers_problem=lambda: gone["why"], max_straggler_wait=30.0)
    t.allreduce(Op.ADD, CELLS)
    start = time.monotonic()
    gone["why"] = "Heartbeat failed: FAILED_PRECONDITION: job 7 ended (lease of rank 1 expired)"
    with pytest.raises(TransportError, match="lease of rank 1 expired"):
        t.allreduce(Op.ADD, CELLS)
    assert time.monotonic() - start < 1.0


def test_a_peer_that_gave_up_ends_the_wait_on_its_call_and_later_ones():
    """Told that rank 1 gave up the call at chunk 6 (while its heartbeats are answered), rank 0
    stops waiting on that call at its next timer check, not after max_straggler_wait, and
    does not tell it back; at a later call (no realignment) too."""
    told: dict = {"gave_up": None}
    tells: list = []
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch, told=lambda: told["gave_up"], tell=tells.append, max_straggler_wait=30.0)
    t.allreduce(Op.ADD, CELLS)
    told["gave_up"] = GaveUp(1, 6, "cannot send to the switch (ENETUNREACH)")
    for _ in range(2):
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"of job 7: rank 1 gave up chunk 6: cannot send"):
            t.allreduce(Op.ADD, CELLS)
        assert time.monotonic() - start < 1.0  # the budget is 0.14 s, a timer check 0.05 s
    assert tells == []


def test_a_give_up_before_the_realignment_is_ignored():
    """After the ranks fell back together and realigned their counters (past the call given
    up), that give-up no longer ends a wait: a slow peer is waited for again."""
    slow = {"at": None}  # when the peer sends chunks 106.. (seconds from the switch's start)

    def peer_sends(k: int) -> float | None:
        if k < 6 or 100 <= k < 106:
            return 0.0
        return slow["at"] if k >= 106 else None

    switch = PeerSwitch(peer_sends)
    t = transport(switch, told=lambda: GaveUp(1, 6, "gone"), max_straggler_wait=30.0)
    t.allreduce(Op.ADD, CELLS)
    with pytest.raises(TransportError, match="rank 1 gave up chunk 6"):
        t.allreduce(Op.ADD, CELLS)  # chunks 6..11
    t.next_chunk = 100  # the agreed counter after the fallback: a new alignment
    assert t.wait.aligned_from == 100
    np.testing.assert_array_equal(t.allreduce(Op.ADD, CELLS), CELLS)  # 100..105
    slow["at"] = time.monotonic() - switch.start + 0.6
    np.testing.assert_array_equal(t.allreduce(Op.ADD, CELLS), CELLS)  # waited for, 0.6 s
    assert time.monotonic() - switch.start >= slow["at"]


def test_a_rank_that_gives_up_for_its_own_reasons_tells_the_others():
    """The first chunk of the call given up and the error, for the others' warnings: a dead
    path, a wait as long as it may be, a local send error."""
    tells: list = []
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch, tell=tells.append)
    t.allreduce(Op.ADD, CELLS)
    switch.dead = True
    with pytest.raises(TransportError, match="the switch path is gone") as info:
        t.allreduce(Op.ADD, CELLS)
    assert tells == [GaveUp(0, 6, str(info.value))]
    slow = transport(
        PeerSwitch(lambda k: 0.0 if k < 6 else None), tell=tells.append, max_straggler_wait=0.4
    )
    slow.allreduce(Op.ADD, CELLS)
    with pytest.raises(TransportError, match="for a slow peer"):
        slow.allreduce(Op.ADD, CELLS)
    assert tells[1].chunk == 6 and "for a slow peer" in tells[1].reason
    with pytest.raises(TransportError, match="ENETUNREACH"):
        transport(Unreachable(), tell=tells.append).allreduce(Op.ADD, CELLS)
    assert tells[2].chunk == 0 and "ENETUNREACH" in tells[2].reason and len(tells) == 3


def test_peers_nobody_vouches_for_end_the_wait_but_not_a_resend():
    """A controller outage (the agent's peers_unproven says so) ends a wait on a peer that
    spent the budget, with that reason; while it lasts, a chunk that is merely lost is still
    resent and completes (the data plane sums without the controller)."""
    outage = {"why": ""}
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch, peers_unproven=lambda: outage["why"], max_straggler_wait=30.0)
    t.allreduce(Op.ADD, CELLS)
    outage["why"] = "no heartbeat answered for 3.3 s (Heartbeat failed: UNAVAILABLE)"
    lossy = PeerSwitch(lambda k: 0.0)
    dropped: set[int] = set()
    real_send = lossy.send

    def lose_first_try(payload: bytes) -> None:  # every chunk's first send is lost
        chunk = int(parse_payloads(payload)[0][0]["chunk"])
        if chunk not in dropped:
            dropped.add(chunk)
            return
        real_send(payload)

    lossy.send = lose_first_try  # type: ignore[method-assign]
    t2 = transport(lossy, peers_unproven=lambda: outage["why"])
    np.testing.assert_array_equal(t2.allreduce(Op.ADD, CELLS), CELLS)
    start = time.monotonic()
    with pytest.raises(TransportError, match="controller is unreachable: no heartbeat answered"):
        t.allreduce(Op.ADD, CELLS)
    assert time.monotonic() - start < 2.0  # the budget (about 0.4 s) and a timeout


def test_the_wait_is_bounded():
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch, max_straggler_wait=0.6)
    t.allreduce(Op.ADD, CELLS)
    with pytest.raises(TransportError, match="for a slow peer"):
        t.allreduce(Op.ADD, CELLS)


def test_without_evidence_the_budget_ends_the_wait():
    """No agent, or no completed chunk to probe with: the former behaviour."""
    switch = PeerSwitch(lambda k: None)
    with pytest.raises(TransportError, match="no completed chunk"):
        transport(switch).allreduce(Op.ADD, CELLS)
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch, peers_problem=None)
    t.allreduce(Op.ADD, CELLS)
    with pytest.raises(TransportError, match="no evidence that the peers are alive"):
        t.allreduce(Op.ADD, CELLS)


def test_after_a_realignment_the_old_probe_is_not_used():
    switch = PeerSwitch(lambda k: 0.0 if k < 6 else None)
    t = transport(switch)
    t.allreduce(Op.ADD, CELLS)
    t.next_chunk += 100  # the hook's realignment after a fallback
    with pytest.raises(TransportError, match="no completed chunk"):
        t.allreduce(Op.ADD, CELLS)


class Unreachable:
    def send(self, payload: bytes) -> None:
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    def recv(self, timeout: float) -> bytes | None:
        return None

    def close(self) -> None:
        pass


def test_a_local_send_error_is_the_switch_path_failing():
    with pytest.raises(TransportError, match=r"ENETUNREACH.*switch path failed"):
        transport(Unreachable()).allreduce(Op.ADD, CELLS)
