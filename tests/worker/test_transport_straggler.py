"""A slow rank is not a dead path, through the switch (both targets) with a controller: a
rank that pauses 10 s is waited for (no fallback, no retransmission storm), and a rank that
dies (no heartbeat, no packets) ends the step within its lease."""

from __future__ import annotations

import time

import numpy as np
import pytest
from agent_fabric import TARGETS, TIMING, Controlled
from test_agent import open_all

from aggwire.constants import CELLS_PER_PKT, Op
from testnet.namespace import have_privileges
from testnet.threads import run_threads
from worker.transport import TransportError

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
POOL = 8
CELLS = np.arange(4 * POOL * CELLS_PER_PKT, dtype=np.int32)


@pytest.fixture(scope="module", params=TARGETS)
def fab(request, tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("straggler"), 2, fabric=True, target=request.param)
    yield c
    c.close()


def both(agents, work) -> list:
    """work(rank, transport) on both ranks at once; (result or exception, seconds) each."""

    def timed(r: int) -> tuple:
        start = time.monotonic()
        try:
            res = work(r, agents[r].transport)
        except Exception as exc:
            res = exc
        return res, time.monotonic() - start

    return run_threads([lambda r=r: timed(r) for r in range(2)], 60)[1]


def retransmission_bound(cfg, pause: float) -> float:
    """What a waiting rank may resend while its peer pauses, at most: as if each chunk in
    flight spent its budget (max_retries resends, after doubling timeouts of about the
    budget's duration) and then resent once per max_timeout for the rest of the pause, plus
    one for the timeout under way when the peer comes back (the budget's duration is taken
    from the floor of the timeout, so the bound errs high). Pool 8, pause 10 s: 214. Measured
    176 on both targets while every chunk was resent at each of its timeouts; 24-25 since an
    expiry resends the oldest chunk only and restarts the others (RFC 6298's one timer). A
    storm is far above: resending at every probe (twice per max_timeout) would be 315, the
    whole pool at every chunk's timeout thousands."""
    budget_s = sum(min(cfg.max_timeout, cfg.min_timeout * 2**k) for k in range(cfg.max_retries))
    per_chunk = cfg.max_retries + max(0.0, pause - budget_s) / cfg.max_timeout + 1
    return POOL * per_chunk


def test_a_rank_that_pauses_10_s_is_waited_for(fab):
    job = fab.create(2, pool_size=POOL)
    agents = open_all(fab, job, 2)
    try:
        both(agents, lambda r, t: t.allreduce(Op.ADD, CELLS))  # a step before the pause
        retx0 = agents[0].transport.stats.retransmissions
        pause = 10.0

        def step(r, t):
            if r == 1:
                time.sleep(pause)  # a checkpoint write before the forward pass
            return t.allreduce(Op.ADD, CELLS)

        (res0, waited), (res1, _) = both(agents, step)
    finally:
        for a in agents:
            a.close()
    for res in (res0, res1):
        assert not isinstance(res, Exception), res
        np.testing.assert_array_equal(res, 2 * CELLS)
    assert waited >= pause - 0.5
    cfg = agents[0].transport.config
    retx = agents[0].transport.stats.retransmissions - retx0
    print(f"{fab.fabric.target}: {retx} retransmissions while waiting {waited:.1f} s")
    assert retx <= retransmission_bound(cfg, waited)
    assert agents[0].transport.wait.probes > 0


def test_a_dead_rank_ends_the_step_within_its_lease(fab):
    job = fab.create(2, pool_size=POOL)
    agents = open_all(fab, job, 2)
    try:
        both(agents, lambda r, t: t.allreduce(Op.ADD, CELLS))
        # rank 1 dies: its heartbeats stop and it sends nothing more
        agents[1]._stop.set()
        agents[1]._thread.join(5)
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"peer is gone|switch path is gone"):
            agents[0].transport.allreduce(Op.ADD, CELLS)
        ended = time.monotonic() - start
    finally:
        for a in agents:
            a.close()
    assert ended <= TIMING["lease"] + TIMING["heartbeat_interval"] + 2.0
