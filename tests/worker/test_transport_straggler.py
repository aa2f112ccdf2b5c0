"""A slow rank is not a dead path, through the reference switch with a controller: a rank
that pauses 10 s is waited for (no fallback, no retransmission storm), and a rank that
dies (no heartbeat, no packets) ends the step within its lease."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from agent_fabric import TIMING, Controlled
from test_agent import open_all

from aggwire.constants import CELLS_PER_PKT, Op
from testnet.namespace import have_privileges
from worker.transport import TransportError

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
POOL = 8
CELLS = np.arange(4 * POOL * CELLS_PER_PKT, dtype=np.int32)


@pytest.fixture(scope="module")
def fab(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("straggler"), 2, fabric=True)
    yield c
    c.close()


def both(agents, work) -> list:
    """work(rank, transport) on both ranks at once; (result or exception, seconds) each."""
    out: list = [None, None]

    def run(r: int) -> None:
        start = time.monotonic()
        try:
            res = work(r, agents[r].transport)
        except Exception as exc:
            res = exc
        out[r] = (res, time.monotonic() - start)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


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
    # the budget's retransmissions, then one per chunk in flight per max_timeout: no storm
    per_chunk = cfg.max_retries + pause / cfg.max_timeout + 2
    assert agents[0].transport.stats.retransmissions - retx0 <= POOL * per_chunk
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
