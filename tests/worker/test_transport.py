"""The worker transport through a real switch (reference switch in namespaces): exact
sums, a pool of slots reused across calls, and loss, duplication and reordering
survived by retransmission."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from homagg.lab.aggjob import Job
from homagg.lab.fabric import Fabric
from homagg.lab.namespace import have_privileges
from homagg.lab.threads import run_threads
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.transport.channel import FaultyChannel, UdpChannel
from homagg.worker.transport.switch_transport import (
    SwitchTransport,
    TransportConfig,
    TransportError,
)

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="transport tests need root and iproute2 (network namespaces)"
)
WORLD = 4


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    with Fabric("refswitch", WORLD, tmp_path_factory.mktemp("transport")) as f:
        for h in f.hosts:
            h.enable_ip_stack()
        yield f


def open_channels(job: Job) -> list[UdpChannel]:
    return [job.channel(r) for r in range(job.world_size)]


def run_workers(transports, work) -> list:
    """Run work(rank, transport) in one thread per worker; re-raise the first error."""
    return run_threads([partial(work, r, t) for r, t in enumerate(transports)], 60)[1]


def make_transports(fabric, pool_size=8, faults=None, max_retries=12):
    job = Job(fabric, fabric.hosts, pool_size=pool_size)
    chans = open_channels(job)
    if faults:
        chans = [FaultyChannel(c, seed=r, **faults) for r, c in enumerate(chans)]
    cfgs = [
        TransportConfig(
            job_id=job.job_id,
            rank=r,
            world_size=WORLD,
            pool_size=pool_size,
            max_retries=max_retries,
        )
        for r in range(WORLD)
    ]
    return [SwitchTransport(c, ch) for c, ch in zip(cfgs, chans)]


def close(transports):
    for t in transports:
        t.channel.close()


@pytest.mark.parametrize("length", [1, CELLS_PER_PKT, 10 * CELLS_PER_PKT + 3])
def test_allreduce_is_exact(fabric, length):
    transports = make_transports(fabric)
    rng = np.random.default_rng(length)
    parts = [rng.integers(-(2**28), 2**28, length).astype(np.int32) for _ in range(WORLD)]
    try:
        got = run_workers(transports, lambda r, t: t.allreduce(Op.ADD, parts[r]))
    finally:
        close(transports)
    expected = np.sum(parts, axis=0, dtype=np.int64).astype(np.int32)
    for g in got:
        np.testing.assert_array_equal(g, expected)
    # No count of retransmissions here: on a loaded machine a slow round trip outlasts the
    # timeout and a resend is right; when the timer fires is tested on a virtual clock
    # (test_transport_timer.py).


def test_many_calls_reuse_the_pool_and_mix_ops(fabric):
    transports = make_transports(fabric, pool_size=4)
    rng = np.random.default_rng(7)
    calls = []
    for op in [Op.ADD, Op.OR, Op.MAX] * 5:
        length = int(rng.integers(1, 3000))  # the same on every worker, as codecs guarantee
        calls.append(
            (op, [rng.integers(-(2**20), 2**20, length).astype(np.int32) for _ in range(WORLD)])
        )
    try:
        got = run_workers(
            transports, lambda r, t: [t.allreduce(op, parts[r]) for op, parts in calls]
        )
    finally:
        close(transports)
    for i, (op, parts) in enumerate(calls):
        expected = {
            Op.ADD: lambda p: np.sum(p, axis=0, dtype=np.int64).astype(np.int32),
            Op.OR: np.bitwise_or.reduce,
            Op.MAX: np.maximum.reduce,
        }[op](parts)
        for r in range(WORLD):
            np.testing.assert_array_equal(got[r][i], expected)


@pytest.mark.parametrize(
    "faults",
    [
        {"loss": 0.05},
        {"duplicate": 0.1, "reorder": 0.1},
        {"loss": 0.01, "duplicate": 0.05, "reorder": 0.05},
    ],
    ids=["loss5", "dup-reorder", "mixed"],
)
def test_faults_are_survived_exactly(fabric, faults):
    transports = make_transports(fabric, faults=faults)
    rng = np.random.default_rng(11)
    parts = [
        rng.integers(-(2**28), 2**28, 40 * CELLS_PER_PKT).astype(np.int32) for _ in range(WORLD)
    ]
    try:
        got = run_workers(
            transports, lambda r, t: [t.allreduce(Op.ADD, parts[r]) for _ in range(3)]
        )
    finally:
        close(transports)
    expected = np.sum(parts, axis=0, dtype=np.int64).astype(np.int32)
    for per_worker in got:
        for g in per_worker:
            np.testing.assert_array_equal(g, expected)
    injected = sum(sum(t.channel.injected.values()) for t in transports)
    assert injected > 0
    if "loss" in faults:
        assert sum(t.stats.retransmissions for t in transports) > 0


def test_unanswered_chunks_raise_instead_of_hanging(fabric):
    """A worker alone (the others never send) gets a TransportError within its retry budget."""
    transports = make_transports(fabric, max_retries=3)
    try:
        with pytest.raises(TransportError, match="no result for chunk"):
            transports[0].allreduce(Op.ADD, np.ones(10, np.int32))
    finally:
        close(transports)


@pytest.mark.parametrize("codec", ["lossless", "lossless_sketch", "fixed_point"])
def test_codec_through_the_switch_equals_the_simulation(fabric, codec):
    """The phases of a codec driven through the switch decode exactly as simulate() says."""
    from homagg.worker.codecs.fixed_point import FixedPoint
    from homagg.worker.codecs.lossless import LosslessSparse
    from homagg.worker.codecs.simulate import simulate

    make = {
        "lossless": lambda: LosslessSparse(WORLD),
        "fixed_point": lambda: FixedPoint(WORLD),
        "lossless_sketch": lambda: LosslessSparse(WORLD, values="sketch"),
    }[codec]
    rng = np.random.default_rng(3)
    xs = []
    for _ in range(WORLD):
        x = np.zeros(50_000, np.float32)
        idx = rng.choice(x.size, 500, replace=False)
        x[idx] = rng.normal(size=idx.size).astype(np.float32)
        xs.append(x)
    expected = simulate([make() for _ in range(WORLD)], xs)
    transports = make_transports(fabric)
    codecs = [make() for _ in range(WORLD)]
    try:
        got = run_workers(transports, lambda r, t: t.run(codecs[r].aggregate(xs[r])))
    finally:
        close(transports)
    for r in range(WORLD):
        np.testing.assert_array_equal(got[r], expected[r])
