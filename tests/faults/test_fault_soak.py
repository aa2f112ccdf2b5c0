"""Loss (1 %, 5 %), duplication and reordering injected between 4 workers and a real switch
(the reference switch always, BMv2 when installed): 200 rounds each, every sum exact on
every worker, no hang, retransmissions counted and reported."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fault_net import NEEDS_ROOT, TARGETS, expected_sum, round_parts, run_threads

from homagg.lab.aggjob import Job
from homagg.lab.fabric import Fabric
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.transport.channel import FaultyChannel
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

pytestmark = NEEDS_ROOT
WORLD, ROUNDS, POOL_SIZE = 4, 200, 8
FAULTS = {
    "loss1": {"loss": 0.01},
    "loss5": {"loss": 0.05},
    "dup-reorder": {"duplicate": 0.05, "reorder": 0.05},
    "all": {"loss": 0.05, "duplicate": 0.05, "reorder": 0.05},
}
# A loss costs a retransmission timeout, and a round trip includes the wait for a peer's
# lost packet, so at 5 % loss the measured timeout climbs toward its 0.5 s cap and the run's
# time is the timeouts (6-17 s a run, not the rounds). The cases but "all" cap it at 0.1 s
# (40 retries: about the defaults' 4 s of retry budget); "all" keeps the defaults.
CAPPED_TIMER = {"max_timeout": 0.1, "max_retries": 40}
DEFAULT_TIMER_CASES = ("all",)


@pytest.fixture(scope="module", params=TARGETS)
def fabric(request, tmp_path_factory):
    with Fabric(request.param, WORLD, tmp_path_factory.mktemp(f"soak-{request.param}")) as f:
        for h in f.hosts:
            h.enable_ip_stack()
        yield f


def faulty_transports(
    fabric: Fabric, faults: dict, seed: int, timer: dict
) -> list[SwitchTransport]:
    job = Job(fabric, fabric.hosts, pool_size=POOL_SIZE)
    out = []
    for r in range(job.world_size):
        chan = FaultyChannel(job.channel(r), seed=seed * 100 + r, **faults)
        cfg = TransportConfig(
            job_id=job.job_id, rank=r, world_size=WORLD, pool_size=POOL_SIZE, **timer
        )
        out.append(SwitchTransport(cfg, chan))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(FAULTS))
def test_rounds_stay_exact_under_faults(fabric, case, fault_report):
    """4 workers x 200 rounds of one packet each through faulty channels: every worker gets
    every round's exact sum; lost packets are retransmitted, duplicates and reordered
    results ignored; no worker hangs (each round bounded by the retry budget)."""
    faults = FAULTS[case]
    seed = list(FAULTS).index(case) + 1
    timer = {} if case in DEFAULT_TIMER_CASES else CAPPED_TIMER
    transports = faulty_transports(fabric, faults, seed, timer)
    rounds = [round_parts(seed * 10_000 + k, WORLD, CELLS_PER_PKT) for k in range(ROUNDS)]
    started = time.monotonic()
    try:
        got = run_threads(
            lambda r: [transports[r].allreduce(Op.ADD, rounds[k][r]) for k in range(ROUNDS)],
            WORLD,
            100,
        )
    finally:
        for t in transports:
            t.channel.close()
    elapsed = time.monotonic() - started
    for r, per_rank in enumerate(got):
        if isinstance(per_rank, BaseException):
            raise per_rank
        for k in range(ROUNDS):
            np.testing.assert_array_equal(
                per_rank[k], expected_sum(rounds[k]), err_msg=f"rank {r} round {k}"
            )
    injected = {
        k: sum(t.channel.injected[k] for t in transports)
        for k in ("lost", "duplicated", "reordered")
    }
    retx = sum(t.stats.retransmissions for t in transports)
    sent = sum(t.stats.packets_sent for t in transports)
    ignored = sum(t.stats.ignored for t in transports)
    fault_report(
        f"{ROUNDS} rounds x {WORLD} workers in {elapsed:.1f} s "
        f"({'timeout capped at 0.1 s' if timer else 'default timer'}): injected {injected}, "
        f"packets sent {sent}, retransmissions {retx}, results ignored {ignored}"
    )
    assert sum(injected.values()) > 0
    assert all(t.stats.chunks == ROUNDS for t in transports)
    if faults.get("loss"):
        assert retx >= injected["lost"] // 2 > 0  # a lost send or a lost result each cost a retry
    if faults.get("duplicate"):
        assert ignored > 0  # duplicated results were recognised and dropped
