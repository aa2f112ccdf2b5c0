"""The retransmission timeout from measured round trips (RFC 6298): the first sample, the
smoothed estimate under steady and varying delays, the bounds, the backoff, Karn's rule in
the transport (no switch needed)."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.transport.retransmission_timer import RetransmissionTimer
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig
from tests.worker.test_transport_header import LoseFirstSend


def test_before_any_sample_the_initial_timeout():
    t = RetransmissionTimer(initial=0.02)
    assert t.rto == 0.02 and t.timeout(1) == 0.04 and t.timeout(3) == 0.16


def test_first_sample_sets_srtt_and_half_variance():
    t = RetransmissionTimer()
    t.sample(0.004)
    assert t.srtt == 0.004 and t.rttvar == 0.002
    assert t.rto == pytest.approx(0.004 + 4 * 0.002)


def test_steady_round_trips_converge_to_srtt_within_the_floor():
    t = RetransmissionTimer(minimum=0.005)
    for _ in range(200):
        t.sample(0.010)
    assert t.srtt == pytest.approx(0.010) and t.rttvar < 1e-6
    assert t.rto == pytest.approx(0.010, abs=1e-5)
    for _ in range(200):
        t.sample(0.0001)
    assert t.rto == 0.005  # the floor


def test_queueing_delay_raises_the_timeout_above_the_delay():
    """Round trips of 30..90 ms (a loaded switch): the timeout covers nearly all of them."""
    rng = np.random.default_rng(1)
    t = RetransmissionTimer()
    rtts = rng.uniform(0.03, 0.09, 2000)
    for r in rtts:
        t.sample(float(r))
    assert t.rto > np.percentile(rtts, 95)
    assert t.rto <= t.maximum


def test_backoff_doubles_and_is_bounded():
    t = RetransmissionTimer(maximum=0.5)
    t.sample(0.01)
    base = t.rto
    assert [t.timeout(k) for k in range(3)] == [base, 2 * base, 4 * base]
    assert t.timeout(20) == 0.5 and t.timeout(10**6) == 0.5
    for _ in range(50):
        t.sample(5.0)  # a spurious huge sample cannot make the transport sit idle
    assert t.rto == 0.5


def test_one_chunks_timeout_is_the_many_chunks_rule():
    """`timeout` (one chunk, plain floats) and `timeouts` (numpy) are the same rule."""
    tries = np.arange(0, 40)
    for backoff, srtt in [(0, None), (0, 0.001), (3, 0.004), (12, 0.03), (35, 0.2)]:
        t = RetransmissionTimer(srtt=srtt, rttvar=0.001, backoff=min(backoff, 30))
        np.testing.assert_array_equal([t.timeout(int(k)) for k in tries], t.timeouts(tries))


def test_fixed_mode_is_the_former_behaviour():
    t = RetransmissionTimer(initial=0.02, adaptive=False)
    t.sample(0.3)
    assert t.rto == 0.02 and t.timeout(2) == 0.08


@pytest.mark.parametrize(
    "kw", [dict(minimum=0.0), dict(initial=0.001, minimum=0.005), dict(initial=1.0, maximum=0.5)]
)
def test_inconsistent_bounds_are_refused(kw):
    with pytest.raises(ValueError, match="minimum <= initial <= maximum"):
        RetransmissionTimer(**kw)


def test_negative_sample_is_refused():
    with pytest.raises(ValueError, match="negative"):
        RetransmissionTimer().sample(-0.001)


def test_the_transport_samples_only_chunks_sent_once():
    """Karn: every chunk here was retransmitted, so no round trip is sampled."""
    transport = SwitchTransport(
        TransportConfig(job_id=1, rank=0, world_size=1, pool_size=4), LoseFirstSend()
    )
    transport.allreduce(Op.ADD, np.ones(3 * CELLS_PER_PKT, np.int32))
    assert transport.stats.retransmissions == 3
    assert transport.timer.samples == 0 and transport.timer.rto == 0.02


def test_a_timeout_backs_off_every_chunk_until_the_next_sample():
    """Two expiry events: every chunk's timeout is 4 x RTO; a chunk's own retries double it
    beyond that only past the events (both count the same expiries of the oldest chunk,
    which each event resends)."""
    t = RetransmissionTimer()
    t.sample(0.01)
    base = t.rto
    t.timed_out(sent=0.0, now=1.0)
    t.timed_out(sent=1.0, now=2.0)  # the retransmission expired too: a second event
    assert t.timeout(0) == pytest.approx(4 * base) and t.timeout(2) == pytest.approx(4 * base)
    np.testing.assert_allclose(t.timeouts(np.array([0, 1, 2, 3])), [4 * base] * 3 + [8 * base])
    t.sample(0.01)  # a new measurement ends the backoff
    assert t.backoff == 0 and t.timeout(0) == pytest.approx(t.rto)
    for k in range(100):
        t.timed_out(sent=float(k), now=float(k))
    assert t.timeout(0) == t.maximum


def test_fixed_mode_does_not_back_off_the_pool():
    t = RetransmissionTimer(adaptive=False)
    t.timed_out(sent=0.0, now=1.0)
    assert t.timeout(0) == 0.02 and t.timeout(1) == 0.04


def test_one_expiry_event_backs_off_once():
    """RFC 6298 backs off once per expiry of its one timer: chunks that were in flight when
    the timer backed off belong to that event, whether they expire in the same wait or a
    little later; only a chunk sent after it (a retransmission, a new chunk) starts another."""
    t = RetransmissionTimer()
    t.sample(0.01)
    for sent in (0.000, 0.001, 0.002, 0.003):  # four chunks lost in one burst, one wait
        t.timed_out(sent=sent, now=0.05)
    assert t.backoff == 1
    t.timed_out(sent=0.004, now=0.09)  # lost in the same burst, expired in a later wait
    assert t.backoff == 1
    t.timed_out(sent=0.05, now=0.2)  # the first retransmission was lost too
    assert t.backoff == 2
    t.sample(0.01)
    t.timed_out(sent=0.03, now=0.3)  # in flight at the last back-off, after a sample
    assert t.backoff == 0
    t.timed_out(sent=0.25, now=0.3)  # sent after it: a new event
    assert t.backoff == 1


def test_a_burst_loss_in_the_transport_backs_off_once():
    """Every chunk of the pool is lost once and times out in the same wait: the timeout
    doubles once (the former per-chunk back-off doubled it once per lost chunk, 2^4 here)."""
    transport = SwitchTransport(
        TransportConfig(job_id=1, rank=0, world_size=1, pool_size=4), LoseFirstSend()
    )
    transport.allreduce(Op.ADD, np.ones(4 * CELLS_PER_PKT, np.int32))
    assert transport.stats.retransmissions == 4
    assert transport.timer.backoff == 1 and transport.timer.samples == 0  # Karn: no sample
