"""The chunk-number wrap through a real switch, on both targets: for every pool size 1..64
the counter starts just below the numbering period, and the sums stay exact across the wrap
with loss and reordering (issue 11 item 1: pools that do not divide 2^32 once broke here)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from homagg.lab.aggjob import Job
from homagg.lab.fabric import Fabric
from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import bmv2_available
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.transport.channel import FaultyChannel
from homagg.worker.transport.chunk_numbering import chunk_period
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig
from tests.worker.test_transport import close, open_channels, run_workers

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="transport tests need root and iproute2 (network namespaces)"
)
WORLD = 2
GROUP = 4  # pool sizes run at once (disjoint pools and hosts), so their timeouts overlap
FAULTS = {"loss": 0.02, "reorder": 0.05}
TARGETS = [
    "refswitch",
    pytest.param(
        "bmv2",
        marks=pytest.mark.skipif(
            not bmv2_available(), reason="simple_switch_grpc is not installed (docs/bmv2.md)"
        ),
    ),
]


@pytest.fixture(scope="module", params=TARGETS)
def fabric(request, tmp_path_factory):
    with Fabric(
        request.param, WORLD * GROUP, tmp_path_factory.mktemp(f"wrap-{request.param}")
    ) as f:
        for h in f.hosts:
            h.enable_ip_stack()
        yield f


def wrap_transports(
    fabric: Fabric, hosts: list, pool_size: int, first_chunk: int
) -> list[SwitchTransport]:
    """One job of pool_size slots on `hosts` whose ranks start at first_chunk, through
    faulty channels."""
    job = Job(fabric, hosts, pool_size=pool_size)
    chans = [
        FaultyChannel(c, seed=1000 * pool_size + r, **FAULTS)
        for r, c in enumerate(open_channels(job))
    ]
    return [
        SwitchTransport(
            TransportConfig(job_id=job.job_id, rank=r, world_size=WORLD, pool_size=pool_size),
            ch,
            first_chunk=first_chunk,
        )
        for r, ch in enumerate(chans)
    ]


def run_calls(calls: list, i: int, t: SwitchTransport) -> list[np.ndarray]:
    """Transport i's results of its job's calls (job i // WORLD, rank i % WORLD)."""
    return [t.allreduce(Op.ADD, parts[i % WORLD]) for parts in calls[i // WORLD]]


def test_every_pool_size_survives_the_wrap(fabric):
    """Chunks P-S .. P-1, then tags 0 .. 2S-1 across the wrap (every copy used before the
    wrap is reused after it), the wrap inside the first of two calls; every rank's result
    is the exact sum."""
    rng = np.random.default_rng(5)
    injected = 0
    for group in range(1, 65, GROUP):
        pool_sizes = range(group, group + GROUP)
        transports, calls = [], []
        for j, s in enumerate(pool_sizes):
            hosts = fabric.hosts[j * WORLD : (j + 1) * WORLD]
            transports += wrap_transports(fabric, hosts, s, chunk_period(s) - s)
            lengths = [(s + 1) * CELLS_PER_PKT, (2 * s - 1) * CELLS_PER_PKT - 7]
            calls += [[rng.integers(-(2**20), 2**20, (WORLD, n)).astype(np.int32) for n in lengths]]
        try:
            got = run_workers(transports, partial(run_calls, calls))
        finally:
            close(transports)
        for j, s in enumerate(pool_sizes):
            for i, parts in enumerate(calls[j]):
                expected = np.sum(parts, axis=0, dtype=np.int64).astype(np.int32)
                for r in range(WORLD):
                    np.testing.assert_array_equal(got[j * WORLD + r][i], expected, f"pool {s}")
            wrapped = chunk_period(s) + 2 * s
            assert all(t.next_chunk == wrapped for t in transports[j * WORLD : (j + 1) * WORLD])
        injected += sum(sum(t.channel.injected.values()) for t in transports)
    assert injected > 0
