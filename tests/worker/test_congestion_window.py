"""The congestion window's rules (slow start, additive increase, one halving per window on a
loss, the floor, the pool as ceiling, on or off), and the transport under it on both I/O
paths against simulated switches on a virtual clock: the first burst is the initial window,
not the pool; a pool late in silence is no loss; a drop-tail queue that a whole pool
overruns costs far fewer resends with the window than without (fails if the window does
not bound what is in flight), both paths alike, and the sums stay exact."""

from __future__ import annotations

import types

import numpy as np
import pytest

from homagg.environment import CONGESTION_WINDOW_ENV, TRANSPORT_IO_ENV
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.transport import switch_transport
from homagg.worker.transport.congestion_window import (
    FLOOR,
    INITIAL_WINDOW,
    CongestionWindow,
    resolve_congestion_window,
)
from homagg.worker.transport.io_path import BATCHED, IO_PATHS, PYTHON
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig
from tests.worker.test_transport_timer import QueuedSwitch, VirtualClock


def test_the_window_starts_at_the_initial_window_below_the_pool():
    assert CongestionWindow(256).limit == INITIAL_WINDOW
    assert CongestionWindow(8).limit == 8  # the pool is the ceiling
    assert CongestionWindow(256, enabled=False).limit == 256
    assert CongestionWindow(2).floor == 2  # a floor above the pool is the pool
    with pytest.raises(ValueError, match=">= 1"):
        CongestionWindow(0)


def test_slow_start_doubles_per_window_then_additive_increase_adds_one():
    w = CongestionWindow(1000)
    w.answered(INITIAL_WINDOW)  # one round trip of answers
    assert w.limit == 2 * INITIAL_WINDOW
    w.ssthresh = w.cwnd = 40.0
    w.answered(40)  # one window of answers above the threshold: about one chunk more
    assert w.limit == 40 and 40.9 < w.cwnd <= 41.0
    w.ssthresh = float("inf")
    w.answered(10_000)
    assert w.cwnd == 1000.0 and w.limit == 1000  # never above the pool


def test_a_loss_halves_once_per_window_and_never_below_the_floor():
    w = CongestionWindow(512)
    w.answered(100)  # 116
    assert w.lost(chunk=10, next_chunk=116)
    assert (w.cwnd, w.ssthresh, w.halvings, w.recover) == (58.0, 58.0, 1, 116)
    assert not w.lost(chunk=115, next_chunk=120)  # sent before the halving: same window
    assert w.cwnd == 58.0 and w.halvings == 1
    assert w.lost(chunk=116, next_chunk=130)  # a chunk of the next window
    assert w.cwnd == 29.0
    for k in range(10):
        w.lost(chunk=200 + 100 * k, next_chunk=300 + 100 * k)
    assert w.cwnd == FLOOR and w.ssthresh == FLOOR
    w.answered(1)  # above the threshold now: additive
    assert FLOOR < w.cwnd < FLOOR + 1


def test_answers_in_a_batch_grow_the_window_as_one_by_one():
    """answered(n) is n answered(1) calls, through slow start, the threshold and the ceiling
    (the batched path grows it batch by batch, the reference chunk by chunk)."""
    rng = np.random.default_rng(7)
    one, many = CongestionWindow(300), CongestionWindow(300)
    chunk = 0
    for _ in range(300):
        n = int(rng.integers(0, 40))
        for _ in range(n):
            one.answered()
        many.answered(n)
        chunk += n
        if rng.random() < 0.2:
            lost = chunk - int(rng.integers(0, 60))
            assert one.lost(lost, chunk) == many.lost(lost, chunk)
        assert one.cwnd == pytest.approx(many.cwnd, rel=1e-12) and one.limit == many.limit


def test_off_the_window_never_moves():
    w = CongestionWindow(64, enabled=False)
    w.answered(100)
    assert not w.lost(0, 10)
    assert w.limit == 64 and w.halvings == 0


def test_realigned_counters_keep_the_recovery_point_behind_them():
    w = CongestionWindow(64)
    w.lost(5, 1000)
    w.realigned(200)  # the ranks resume at 200 (after a fallback)
    assert w.lost(200, 260)


def test_on_unless_the_config_or_the_environment_says_off(monkeypatch):
    monkeypatch.delenv(CONGESTION_WINDOW_ENV, raising=False)
    assert resolve_congestion_window() is True
    monkeypatch.setenv(CONGESTION_WINDOW_ENV, "0")
    assert resolve_congestion_window() is False
    assert resolve_congestion_window(True) is True  # the config wins
    monkeypatch.setenv(CONGESTION_WINDOW_ENV, "off")
    assert resolve_congestion_window() is False
    monkeypatch.setenv(CONGESTION_WINDOW_ENV, "maybe")
    with pytest.raises(ValueError, match=CONGESTION_WINDOW_ENV):
        resolve_congestion_window()


class DropTailSwitch(QueuedSwitch):
    """A QueuedSwitch whose queue holds `capacity` datagrams: one more arriving is dropped
    (a socket's or a shaper's queue)."""

    def __init__(self, service: float, clock: VirtualClock, capacity: int) -> None:
        super().__init__(service, clock)
        self.capacity = capacity
        self.dropped = 0

    def send(self, payload: bytes) -> None:
        if (self.free_at - self.clock()) / self.service >= self.capacity:
            self.dropped += 1
            self.sent.append((self.clock(), -1, False))
            return
        super().send(payload)


def _transport(switch: QueuedSwitch, pool: int, window: bool) -> SwitchTransport:
    # both I/O paths step by step alike on the virtual clock: no waits for results to gather
    cfg = TransportConfig(
        job_id=1, rank=0, world_size=2, pool_size=pool, initial_timeout=0.02,
        min_timeout=0.01, congestion_window=window, coalesce_results=False,
    )  # fmt: skip
    return SwitchTransport(cfg, switch)


def _virtual_clock(monkeypatch: pytest.MonkeyPatch, path: str) -> VirtualClock:
    """The transport on I/O path `path`, its clock a virtual one (tests/worker/
    test_transport_timer.py)."""
    monkeypatch.setenv(TRANSPORT_IO_ENV, path)
    clock = VirtualClock()
    monkeypatch.setattr(
        switch_transport, "time", types.SimpleNamespace(monotonic=clock, perf_counter=clock)
    )
    return clock


@pytest.mark.parametrize("path", IO_PATHS)
def test_the_first_burst_is_the_initial_window_not_the_pool(monkeypatch, path: str):
    clock = _virtual_clock(monkeypatch, path)
    switch = QueuedSwitch(0.001, clock)
    t = _transport(switch, 256, True)
    cells = np.arange(64 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    first = switch.sent[0][0]
    assert sum(1 for at, _, _ in switch.sent if at == first) == INITIAL_WINDOW
    assert t.stats.cwnd == INITIAL_WINDOW + 64 and t.stats.cwnd_halvings == 0


@pytest.mark.parametrize("path", IO_PATHS)
def test_a_pool_late_in_silence_is_no_loss_and_keeps_the_window(monkeypatch, path: str):
    """The peers come 0.3 s late (a slow rank, the scheduler): the oldest chunk times out
    several times, but nothing was answered meanwhile, so no chunk was lost: the window
    stays (halving here cut it for nothing, measured on the eBPF target)."""
    clock = _virtual_clock(monkeypatch, path)
    switch = QueuedSwitch(0.0005, clock)
    t = _transport(switch, 16, True)
    switch.open_at(clock() + 0.3)
    cells = np.arange(16 * CELLS_PER_PKT, dtype=np.int32)
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    assert t.stats.timeouts >= 3 and t.stats.cwnd_halvings == 0 and t.stats.cwnd == 16


def _overrun(monkeypatch: pytest.MonkeyPatch, path: str, window: bool) -> tuple:
    """One call of 192 chunks with a pool of 64 into a queue of 16 (1 ms a datagram), on
    I/O path `path`: (datagrams dropped, retransmissions, timeouts, window, halvings,
    virtual seconds)."""
    clock = _virtual_clock(monkeypatch, path)
    switch = DropTailSwitch(0.001, clock, capacity=16)
    t = _transport(switch, 64, window)
    start = clock()
    cells = np.arange(192 * CELLS_PER_PKT, dtype=np.int32) - 7
    np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
    s = t.stats
    assert s.retransmissions >= switch.dropped  # every loss was resent
    return switch.dropped, s.retransmissions, s.timeouts, s.cwnd, s.cwnd_halvings, clock() - start


def test_a_queue_a_pool_overruns_costs_fewer_resends_with_the_window(monkeypatch):
    """Without the window the first burst of the pool loses 48 chunks and every burst of
    resends overruns the queue again (9 s of virtual time here); with it the losses come
    only when slow start overshoots, the window halves and the call ends 30 times sooner.
    Both I/O paths send, lose and resend exactly alike."""
    on = {p: _overrun(monkeypatch, p, True) for p in IO_PATHS}
    off = {p: _overrun(monkeypatch, p, False) for p in IO_PATHS}
    assert on[PYTHON] == on[BATCHED] and off[PYTHON] == off[BATCHED]
    dropped, retx, timeouts, cwnd, halvings, secs = on[PYTHON]
    assert halvings >= 1 and FLOOR <= cwnd < 64 and timeouts <= retx
    assert off[PYTHON][3:5] == (64, 0)  # off: the pool, never halved
    assert 2 * dropped < off[PYTHON][0] and 10 * secs < off[PYTHON][5]
