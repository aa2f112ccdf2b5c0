"""The batched I/O path's pieces without a switch: sendmmsg / recvmmsg on loopback UDP
sockets (lengths, a datagram from elsewhere ignored, a full batch), the batch updates of
Flight against the per-chunk ones, a C library without the calls (one warning, datagram
by datagram), a batch of results out of order, duplicated and mixed
with strays placed exactly once each, and the choice of the path."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest

from homagg.environment import TRANSPORT_IO_ENV
from homagg.wire.constants import CELLS_PER_PKT, Flag, Op
from homagg.wire.header import header_view
from homagg.worker.transport import channel as channel_module
from homagg.worker.transport.channel import FaultyChannel, UdpChannel, recv_many
from homagg.worker.transport.flight import Flight
from homagg.worker.transport.io_path import BATCHED, PYTHON, resolve_io_path
from homagg.worker.transport.mmsg import mmsg_problem
from homagg.worker.transport.retransmission_timer import RetransmissionTimer
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

pytestmark = pytest.mark.skipif(bool(mmsg_problem()), reason=mmsg_problem() or "-")
I32 = np.iinfo(np.int32)


@pytest.fixture
def pair():
    """Two UDP channels on loopback, each towards the other."""
    socks = []
    for _ in range(2):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        socks.append(s)
    a = UdpChannel(socks[0], socks[1].getsockname())
    b = UdpChannel(socks[1], socks[0].getsockname())
    yield a, b
    a.close()
    b.close()


def receive_all(channel, count: int, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    rows, lengths = [], []
    for _ in range(50):
        r, n = recv_many(channel, 0.05, row_bytes)
        rows.append(r.copy())
        lengths.append(n)
        if sum(len(x) for x in lengths) >= count:
            break
    return np.concatenate(rows), np.concatenate(lengths)


def test_a_batch_goes_and_comes_whole(pair):
    a, b = pair
    rows = np.random.default_rng(0).integers(0, 256, (300, 1040), dtype=np.uint8)  # > 1 call
    a.send_many(rows)
    got, lengths = receive_all(b, 300, 1041)
    assert got.shape == (300, 1041) and (lengths == 1040).all()
    np.testing.assert_array_equal(got[:, :1040], rows)


def test_lengths_say_short_and_long_datagrams_and_strangers_are_ignored(pair):
    a, b = pair
    a.send(b"x" * 10)
    a.send(b"y" * 2000)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.sendto(b"z" * 1040, b.sock.getsockname())
    stranger.close()
    a.send(b"w" * 1040)
    got, lengths = receive_all(b, 3, 1041)
    assert lengths.tolist() == [10, 1041, 1040]  # the long one capped: not a payload
    assert bytes(got[0, :10]) == b"x" * 10 and bytes(got[2, :1040]) == b"w" * 1040


def test_a_send_error_names_its_errno(pair):
    a, _ = pair
    a.service = ("0.0.0.0", 0)  # port 0: EINVAL from the kernel
    a._mmsg = None
    with pytest.raises(OSError) as err:
        a.send_many(np.zeros((2, 8), np.uint8))
    assert err.value.errno is not None


def test_flight_batches_equal_chunk_by_chunk():
    """sendable / sent_many / answered_many / resent_many leave a Flight as the per-chunk
    updates do (may_send / sent), under a window that changes between rounds."""
    rng = np.random.default_rng(1)
    one, many = Flight(40, restarts=True), Flight(40, restarts=True)
    pool, now = 8, 0.0
    while one.remaining:
        now += 1.0
        window = int(rng.integers(1, pool + 2))
        k = many.sendable(pool, window)
        start = one.next_to_send
        while one.may_send(pool, window):
            one.sent(one.next_to_send, now)
            one.next_to_send += 1
        assert k == one.next_to_send - start
        assert one.in_flight == many.in_flight + k <= max(window, many.in_flight)
        many.sent_many(start, start + k, now)
        open_ = np.flatnonzero(~one.done[: one.next_to_send])
        again = rng.choice(open_, min(2, open_.size), replace=False)
        for i in again:
            one.resent(int(i), now)
        many.resent_many(np.sort(again), now)
        idx = np.sort(rng.choice(open_, min(open_.size, int(rng.integers(1, 6))), replace=False))
        for i in idx:
            one.answered(int(i), now)
        many.answered_many(idx, now)
        for name in ("done", "tries", "last_sent", "first_resent", "answered_at", "sent_at"):
            np.testing.assert_array_equal(getattr(one, name), getattr(many, name))
        assert (one.oldest, one.remaining, one.answered_before_oldest) == (
            many.oldest,
            many.remaining,
            many.answered_before_oldest,
        )


@pytest.mark.parametrize("restarts", [True, False])
def test_the_deadline_bound_never_passes_the_first_deadline(restarts):
    """The exchange looks at its timers only once `deadline_bound` has passed: it must be
    at most `next_deadline` whatever was sent, resent, answered, restarted or backed off,
    and equal to it when nothing was answered or restarted since the oldest chunk's send."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        flight, timer = Flight(24, restarts=restarts), RetransmissionTimer()
        now, exact_seen = 0.0, 0
        while flight.remaining:
            now += float(rng.exponential(0.004))
            k = flight.sendable(8, int(rng.integers(1, 10)))
            flight.sent_many(flight.next_to_send, flight.next_to_send + k, now)
            open_ = np.flatnonzero(~flight.done[: flight.next_to_send])
            if open_.size and rng.random() < 0.3:
                flight.resent_many(rng.choice(open_, 1), now)
            if open_.size and rng.random() < 0.2:  # a silent expiry: timers restart
                flight.restarted_at[open_] = now
            if rng.random() < 0.3:
                timer.timed_out(now - 1.0, now)
            if rng.random() < 0.3:
                timer.sample(float(rng.uniform(0.0005, 0.02)))
            bound, exact = flight.deadline_bound(timer), flight.next_deadline(timer)
            assert bound <= exact
            assert (bound == np.inf) == (flight.in_flight == 0) == (exact == np.inf)
            exact_seen += bound == exact and flight.in_flight > 0
            take = min(open_.size, int(rng.integers(0, 4)))
            if take:
                flight.answered_many(np.sort(rng.choice(open_, take, replace=False)), now)
        assert exact_seen, "the bound was never exact: the test checks nothing tight"


def test_the_path_is_the_config_then_the_environment_then_batched(monkeypatch, pair):
    monkeypatch.delenv(TRANSPORT_IO_ENV, raising=False)
    assert resolve_io_path() == BATCHED
    monkeypatch.setenv(TRANSPORT_IO_ENV, PYTHON)
    assert resolve_io_path() == PYTHON
    assert resolve_io_path(BATCHED) == BATCHED
    cfg = TransportConfig(job_id=1, rank=0, world_size=1, pool_size=4)
    assert SwitchTransport(cfg, pair[0]).io_path == PYTHON
    monkeypatch.setenv(TRANSPORT_IO_ENV, "fast")
    with pytest.raises(ValueError, match="HOMAGG_TRANSPORT_IO must be one of batched, python"):
        SwitchTransport(cfg, pair[0])
    with pytest.raises(ValueError, match=r"TransportConfig\.io_path must be one of"):
        resolve_io_path("mmap")


class CraftedBatches:
    """A one-worker switch that answers each batch of sends with one batch of its own:
    the results in reverse order, each twice, among a result of another job, one for
    another rank, a contribution (no RESULT flag) and a datagram too short."""

    def __init__(self) -> None:
        self.pending: list[np.ndarray] = []
        self.rows_seen = 0

    def send_many(self, rows: np.ndarray) -> None:
        self.rows_seen += rows.shape[0]
        answers = rows[::-1].copy()
        header_view(answers)["flags"] = int(Flag.RESULT)
        strays = rows[:4].copy()
        header_view(strays)["flags"] = int(Flag.RESULT)
        header_view(strays[0:1])["job_id"] = 99
        header_view(strays[1:2])["rank"] = 3
        header_view(strays[2:3])["flags"] = 0
        batch = np.concatenate([strays[:3], answers, answers, strays[3:]])
        out = np.zeros((batch.shape[0], batch.shape[1] + 1), np.uint8)
        out[:, :-1] = batch
        lengths = np.full(out.shape[0], batch.shape[1])
        lengths[-1] = 10  # too short: not a payload
        self.pending.append((out, lengths))

    def recv_many(self, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.pending:
            return np.zeros((0, row_bytes), np.uint8), np.zeros(0, np.int64)
        return self.pending.pop(0)

    def send(self, payload: bytes) -> None:
        raise AssertionError("the batched path sends batches")

    def recv(self, timeout: float) -> bytes | None:
        raise AssertionError("the batched path receives batches")

    def close(self) -> None:
        pass


def test_a_batch_with_duplicates_strays_and_reordering_places_each_result_once():
    switch = CraftedBatches()
    cfg = TransportConfig(job_id=7, rank=0, world_size=1, pool_size=8, io_path=BATCHED)
    t = SwitchTransport(cfg, switch)
    cells = np.arange(20 * CELLS_PER_PKT - 3, dtype=np.int32) * -7919
    cells[:3] = [I32.min, I32.max, -1]
    np.testing.assert_array_equal(t.allreduce(Op.MAX, cells), cells)
    assert t.stats.results == 20 and t.stats.retransmissions == 0
    batches = -(-20 // 8)  # 8, then as the pool frees
    assert t.stats.ignored >= 20 + 4 * batches  # the duplicates and the strays


def test_without_sendmmsg_a_channel_says_so_once_and_sends_one_by_one(monkeypatch, caplog):
    """Where the C library lacks the calls, UDP channels warn once per process and send and
    receive one datagram per call; the batches still go and come whole."""
    monkeypatch.setattr(channel_module, "mmsg_problem", lambda: "no sendmmsg here")
    channel_module._note_no_mmsg.cache_clear()
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    with caplog.at_level(logging.WARNING):
        a = UdpChannel(socks[0], socks[1].getsockname())
        b = UdpChannel(socks[1], socks[0].getsockname())
    try:
        assert not a.batched and not b.batched
        said = [r for r in caplog.records if "batched datagram I/O unavailable" in r.message]
        assert len(said) == 1 and "no sendmmsg here" in said[0].message
        rows = np.arange(3 * 40, dtype=np.int64).astype(np.uint8).reshape(3, 40)
        a.send_many(rows)
        got, lengths = receive_all(b, 3, 41)
        np.testing.assert_array_equal(got[:, :40], rows)
        assert (lengths == 40).all() and a._mmsg is None and b._mmsg is None
    finally:
        a.close()
        b.close()
        channel_module._note_no_mmsg.cache_clear()


def test_the_fault_wrapper_passes_batches_through_with_per_datagram_faults(pair):
    """Every datagram duplicated on the way out, and on the way in: 4x each, as batches."""
    a, b = pair
    fa, fb = FaultyChannel(a, duplicate=1.0), FaultyChannel(b, duplicate=1.0)
    rows = np.arange(3 * 40, dtype=np.int64).astype(np.uint8).reshape(3, 40)
    fa.send_many(rows)
    got, lengths = fb.recv_many(0.5, 41)
    for _ in range(20):
        if len(lengths) >= 12:
            break
        more = fb.recv_many(0.05, 41)
        got, lengths = np.concatenate([got, more[0]]), np.concatenate([lengths, more[1]])
    assert (lengths == 40).all() and sorted(bytes(r[:40]) for r in got) == sorted(
        bytes(r) for r in rows for _ in range(4)
    )
    assert fa.injected["duplicated"] == 3 and fb.injected["duplicated"] == 6
    lossy = FaultyChannel(a, loss=1.0)
    lossy.send_many(rows)
    assert len(recv_many(b, 0.05, 41)[1]) == 0 and lossy.injected["lost"] == 3


class CountingEcho:
    """A one-worker switch answering every batch at once, counting the looks at its
    socket that found nothing."""

    def __init__(self) -> None:
        self.pending: list[np.ndarray] = []
        self.empty_looks = 0

    def send_many(self, rows: np.ndarray) -> None:
        out = np.zeros((rows.shape[0], rows.shape[1] + 1), np.uint8)
        out[:, :-1] = rows
        header_view(out)["flags"] = int(Flag.RESULT)
        self.pending.append(out)

    def recv_many(self, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.pending:
            self.empty_looks += 1
            return np.zeros((0, row_bytes), np.uint8), np.zeros(0, np.int64)
        out = self.pending.pop(0)
        return out, np.full(out.shape[0], out.shape[1] - 1)

    def close(self) -> None:
        pass


def test_a_short_batch_of_results_is_not_followed_by_an_empty_look():
    """Each batch of results short of a full receive left the socket empty: the exchange
    goes on to its next send or wait, where a wait's poll finds what comes next, rather
    than receiving again for nothing (two per round trip before, ~10 us each in Python)."""
    echo = CountingEcho()
    cfg = TransportConfig(job_id=7, rank=0, world_size=1, pool_size=8, io_path=BATCHED)
    t = SwitchTransport(cfg, echo)
    cells = np.arange(20 * CELLS_PER_PKT, dtype=np.int32) - 5
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    assert t.stats.results == 20 and echo.empty_looks == 0
