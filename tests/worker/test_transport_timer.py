"""The transport's retransmission timers against a simulated queueing switch (no switch
needed): a pool that is late, not lost, costs at most the oldest chunk's resends; a switch
that answers in order but slower than the timeout is waited for; a pool lost whole is
resent at once when the first resend's answer proves it lost. The first two fail with the
former policy (every chunk's timer from its own send, every expired chunk resent), the third
without the last rule (one resend per doubling timeout). A chunk that a later answer proves
skipped is resent at its own timeout, whatever else expires; one that three later answers
passed over is resent at once (fails without fast retransmit).

The queueing switch runs on a virtual clock that the transport reads too: waiting for an
answer advances it, nothing sleeps, so the timings are exact on a loaded machine. Every
test on that clock runs on both I/O paths (the batched one takes the same rules)."""

from __future__ import annotations

import heapq
import types

import numpy as np
import pytest

from homagg.environment import TRANSPORT_IO_ENV
from homagg.lab.threads import run_threads
from homagg.wire.constants import CELLS_PER_PKT, Flag, Op
from homagg.wire.header import header_view
from homagg.wire.packer import parse_payloads
from homagg.worker.transport import switch_transport
from homagg.worker.transport.flight import Flight
from homagg.worker.transport.io_path import IO_PATHS
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig
from tests.worker.test_transport_header import LoseFirstSend

PRIMING = 20  # one-chunk calls: the estimate forgets a slow first one


class VirtualClock:
    """Monotonic seconds that move only when the switch is waited on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=IO_PATHS)
def clock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """The transport's clock replaced by a virtual one (its stats' perf_counter too), on
    each I/O path in turn (the batched path reads the transport's clock)."""
    monkeypatch.setenv(TRANSPORT_IO_ENV, request.param)
    c = VirtualClock()
    monkeypatch.setattr(
        switch_transport, "time", types.SimpleNamespace(monotonic=c, perf_counter=c)
    )
    return c


class QueuedSwitch:
    """One rank's view of a switch that processes datagrams one at a time in arrival order,
    `service` s each, none before `opens_at` (monotonic; when the peers' contributions get
    there). A chunk's first contribution completes its round (RESULT) once processed and
    the peer's contribution is in (`peer_at`: chunk -> monotonic time, default at once); a
    later one is answered RESULT|RETX if the round is complete by then, else dropped as a
    duplicate. The first send of each chunk in `lose_first` is lost on the way. Keeps
    (monotonic time, chunk, resent?) of every datagram sent."""

    def __init__(self, service: float, clock: VirtualClock) -> None:
        self.service = service
        self.clock = clock
        self.free_at = 0.0
        self.complete_at: dict[int, float] = {}
        self.peer_at: dict[int, float] = {}
        self.lose_first: set[int] = set()
        self.pending: list[tuple[float, int, bytes]] = []  # a heap by answer time
        self.sent: list[tuple[float, int, bool]] = []

    def open_at(self, when: float) -> None:
        self.free_at = max(self.free_at, when)

    def send(self, payload: bytes) -> None:
        now = self.clock()
        header = parse_payloads(payload)[0][0]
        chunk, resent = int(header["chunk"]), bool(int(header["flags"]) & Flag.RETX)
        self.sent.append((now, chunk, resent))
        if chunk in self.lose_first:
            self.lose_first.discard(chunk)
            return
        self.free_at = max(self.free_at, now) + self.service
        if chunk not in self.complete_at:
            self.complete_at[chunk] = max(self.free_at, self.peer_at.get(chunk, 0.0))
            self._answer(self.complete_at[chunk], payload, Flag.RESULT)
        elif self.free_at >= self.complete_at[chunk]:
            self._answer(self.free_at, payload, Flag.RESULT | Flag.RETX)

    def _answer(self, at: float, payload: bytes, flags: int) -> None:
        reply = np.frombuffer(payload, np.uint8).copy()
        header_view(reply)["flags"] = int(flags)
        heapq.heappush(self.pending, (at, len(self.sent), reply.tobytes()))

    def recv(self, timeout: float) -> bytes | None:
        end = self.clock() + timeout
        if self.pending and self.pending[0][0] <= end:
            at, _, reply = heapq.heappop(self.pending)
            self.clock.now = max(self.clock.now, at)
            return reply
        self.clock.now = end
        return None

    def close(self) -> None:
        pass

    def resent_chunks(self) -> list[int]:
        return [chunk for _, chunk, resent in self.sent if resent]


def primed(switch, pool_size: int, timeout: float) -> SwitchTransport:
    """A transport whose measured timeout sits at its floor `timeout` (fast round trips)."""
    cfg = TransportConfig(
        job_id=1,
        rank=0,
        world_size=2,
        pool_size=pool_size,
        initial_timeout=timeout,
        min_timeout=timeout,
        coalesce_results=False,  # the timers on the virtual clock, look by look
    )
    t = SwitchTransport(cfg, switch)
    for _ in range(PRIMING):
        t.allreduce(Op.ADD, np.ones(CELLS_PER_PKT, np.int32))
    assert t.timer.rto == timeout and not t.stats.retransmissions
    return t


def test_a_late_pool_costs_the_oldest_chunks_resends_only(clock: VirtualClock):
    """The peers' contributions come 0.3 s after this rank's 16 (a rank that computes longer):
    only the oldest chunk is resent, once per doubling of its 20 ms timeout (4 times by
    0.3 s: 20 + 40 + 80 + 160 ms), not the whole pool at each expiry (formerly 32)."""
    switch = QueuedSwitch(0.0005, clock)
    t = primed(switch, 16, 0.02)
    switch.open_at(clock() + 0.3)
    cells = np.arange(16 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    assert set(switch.resent_chunks()) == {PRIMING}  # the call's first chunk
    assert t.stats.retransmissions <= 5


def test_a_switch_slower_than_the_timeout_is_waited_for_while_it_answers(clock: VirtualClock):
    """The switch answers a chunk every 30 ms in order, the timeout is 40 ms: the last of 8
    chunks comes back after 240 ms, yet each one within 40 ms of the one ahead of it (RFC
    6298 5.3: an answer restarts the timer), so none is resent (formerly the 7 not
    answered at 40 ms were)."""
    switch = QueuedSwitch(0.0005, clock)
    t = primed(switch, 8, 0.04)
    switch.service = 0.03
    cells = np.arange(8 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    assert t.stats.retransmissions == 0


def test_a_skipped_chunk_is_resent_at_its_own_timeout(clock: VirtualClock):
    """Chunk 2 waits 0.3 s for the peer (whose contribution was lost), chunk 5's own
    contribution is lost, the others are answered at once: chunk 5 is resent at its own
    timeout (a later chunk was answered since its timer started: it was skipped), not held
    back by chunk 2's expiry (that restarting every timer would cost 2 x 50 ms more)."""
    switch = QueuedSwitch(0.0005, clock)
    t = primed(switch, 8, 0.05)
    start = clock()
    switch.peer_at[PRIMING + 2] = start + 0.3
    switch.lose_first.add(PRIMING + 5)
    cells = np.arange(8 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    resent_5 = [at for at, chunk, resent in switch.sent if resent and chunk == PRIMING + 5]
    assert resent_5 and resent_5[0] - start < 0.09


def test_a_lost_chunk_is_resent_once_three_later_ones_are_answered(clock: VirtualClock):
    """Chunk 1's contribution is lost and the timeout is 300 ms: once the switch answered
    chunks 2, 3 and 4 (it answers in order, so chunk 1 was lost) chunk 1 is resent at once
    (fast retransmit) and the call ends far sooner than the timeout (it waited for it)."""
    switch = QueuedSwitch(0.0005, clock)
    t = primed(switch, 8, 0.3)
    switch.lose_first.add(PRIMING + 1)
    start = clock()
    cells = np.arange(8 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    assert clock() - start < 0.15
    assert switch.resent_chunks() == [PRIMING + 1] and t.stats.retransmissions == 1


def test_which_chunks_were_passed_over():
    """Flight.passed_over: a chunk sent once with at least `answers` later chunks answered;
    not one overtaken by fewer (a reordered datagram), nor one already resent."""
    flight = Flight(8, restarts=True)
    for i in range(8):
        flight.sent(i, float(i))
    flight.next_to_send = 8
    for i in (2, 3, 5, 6):
        flight.answered(i, 10.0 + i)
    # 0 and 1: four later answers; 4: two (5, 6); 7: none
    np.testing.assert_array_equal(flight.passed_over(6, 3), [0, 1])
    np.testing.assert_array_equal(flight.passed_over(6, 2), [0, 1, 4])
    flight.resent(0, 20.0)
    np.testing.assert_array_equal(flight.passed_over(6, 3), [1])
    flight.answered(1, 21.0)
    np.testing.assert_array_equal(flight.passed_over(3, 3), [])  # 0 was resent, 1 and 2 done


class LoseFirstSendOnClock(LoseFirstSend):
    """LoseFirstSend whose silence lasts the whole wait on the virtual clock."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def recv(self, timeout: float) -> bytes | None:
        reply = super().recv(timeout)
        if reply is None:
            self.clock.now += timeout
        return reply


def test_a_pool_lost_whole_is_resent_at_once_after_the_first_answer(clock: VirtualClock):
    """Every first send of 16 chunks is lost: the oldest chunk is resent at its timeout, and
    its resent result (the switch answers in order) proves the other 15 lost: they go at
    once, not one per doubling timeout (which would take seconds)."""
    transport = SwitchTransport(
        TransportConfig(
            job_id=1,
            rank=0,
            world_size=1,
            pool_size=16,
            initial_timeout=0.05,
            coalesce_results=False,
        ),
        LoseFirstSendOnClock(clock),
    )
    start = clock()
    cells = np.arange(16 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(transport.allreduce(Op.ADD, cells), cells)
    assert clock() - start < 0.5
    assert transport.stats.retransmissions == 16 and transport.timer.backoff == 1


def test_when_each_timer_started():
    """Flight.starts: a queued chunk's timer starts at the latest answer ahead of it, a
    skipped one's (a later chunk answered since its last send) at its last send."""
    flight = Flight(5, restarts=True)
    for i in range(5):
        flight.sent(i, float(i))
    flight.next_to_send = 5
    flight.answered(1, 10.0)
    flight.answered(3, 12.0)
    # 0 and 2 skipped (3 answered since), 4 queued behind 3's answer
    np.testing.assert_array_equal(flight.starts()[[0, 2, 4]], [0, 2, 12])
    flight.answered(0, 13.0)  # the answers before the oldest open chunk are folded
    assert flight.oldest == 2
    np.testing.assert_array_equal(flight.starts()[[0, 2]], [2, 13])
    flight.resent(2, 14.0)  # no answer since its resend: queued again
    np.testing.assert_array_equal(flight.starts()[[0, 2]], [14, 13])
    assert Flight(5, restarts=False).starts().size == 0


class StrayFlood(LoseFirstSend):
    """LoseFirstSend behind a link that always has a stray datagram (another job's) ready."""

    def recv(self, timeout: float) -> bytes | None:
        reply = super().recv(timeout)
        if reply is not None:
            return reply
        stray = np.frombuffer(self.sent[0], np.uint8).copy()
        header_view(stray)["job_id"] = 99
        header_view(stray)["flags"] = int(Flag.RESULT)
        return stray.tobytes()


def test_stray_datagrams_do_not_hold_the_timers_back():
    """Datagrams of another job arrive without pause (a flood): the lost chunks still time
    out (formerly the transport read the flood and never looked at its timers again)."""
    transport = SwitchTransport(
        TransportConfig(job_id=1, rank=0, world_size=1, pool_size=4), StrayFlood()
    )
    cells = np.arange(4 * CELLS_PER_PKT, dtype=np.int32)
    _, (got,) = run_threads([lambda: transport.allreduce(Op.ADD, cells)], 5.0)
    np.testing.assert_array_equal(got, cells)
    assert transport.stats.ignored > 0 and transport.stats.retransmissions == 4
