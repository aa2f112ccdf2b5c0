"""Aggregation semantics on the wire, identical for BMv2 and the reference switch."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from packet_checks import assert_result_frame

from homagg.lab.aggjob import CounterDelta, Job, random_cells, result_cells, wrapped_sum
from homagg.lab.fabric import Fabric
from homagg.wire.constants import CELLS_PER_PKT, DropReason, Event, Flag, Op
from homagg.wire.scapy_layer import Agg

QUIET = 0.3  # seconds to wait before concluding that nothing more arrives


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 8, tmp_path_factory.mktemp(target)) as f:
        yield f


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_full_round_returns_exact_sum_to_every_worker(fabric, rng, world):
    job = Job(fabric, fabric.hosts[:world])
    parts = [random_cells(rng) for _ in range(world)]
    counters = CounterDelta(fabric)
    for r in range(world):
        job.send(r, parts[r], slot=3, shadow=1, chunk=7, exp=100 + r)
    got = job.collect()
    for r in range(world):
        assert len(got[r]) == 1, f"rank {r} got {len(got[r])} results"
        pkt = got[r][0]
        assert_result_frame(pkt, job, r)
        assert pkt[Agg].flags == Flag.RESULT
        assert (pkt[Agg].slot, pkt[Agg].shadow, pkt[Agg].chunk) == (3, 1, 7)
        assert pkt[Agg].exp == 100 + world - 1, "exponent is combined with MAX"
        np.testing.assert_array_equal(result_cells(pkt), wrapped_sum(parts))
    assert counters.events() == {Event.CONTRIBUTION: world, Event.RESULT: 1}
    assert counters.drops() == {}


@pytest.mark.parametrize("op", [Op.OR, Op.MAX])
def test_or_and_max(fabric, rng, op):
    job = Job(fabric, fabric.hosts[:4])
    parts = [
        rng.integers(-(1 << 31), 1 << 31, CELLS_PER_PKT, dtype=np.int64).astype(np.int32)
        for _ in range(4)
    ]
    for r in range(4):
        job.send(r, parts[r], op=op)
    expected = np.bitwise_or.reduce(parts) if op == Op.OR else np.maximum.reduce(parts)
    for pkts in job.collect().values():
        np.testing.assert_array_equal(result_cells(pkts[0]), expected)


def test_int32_sum_wraps_per_cell(fabric):
    """Documented behaviour: cells wrap like int32 (two's complement), no carry between cells."""
    job = Job(fabric, fabric.hosts[:2])
    big = np.full(CELLS_PER_PKT, 2**31 - 1, np.int32)
    small = np.arange(CELLS_PER_PKT, dtype=np.int32) - 5
    job.send(0, big)
    job.send(1, small)
    got = result_cells(job.collect()[0][0])
    np.testing.assert_array_equal(got, wrapped_sum([big, small]))
    assert got[6] == -(2**31)  # INT32_MAX + 1 wraps to INT32_MIN


def test_duplicate_before_completion_is_dropped_and_counted(fabric, rng):
    job = Job(fabric, fabric.hosts[:3])
    parts = [random_cells(rng) for _ in range(3)]
    counters = CounterDelta(fabric)
    job.send(0, parts[0])
    job.send(0, parts[0])  # retransmission before the round completed
    job.send(1, parts[1])
    assert all(not v for v in job.collect(timeout=QUIET).values()), "no result before the last rank"
    job.send(2, parts[2])
    for _r, pkts in job.collect().items():
        np.testing.assert_array_equal(result_cells(pkts[0]), wrapped_sum(parts))
    assert counters.drops() == {DropReason.DUPLICATE: 1}


def test_retransmission_after_completion_gets_result_to_sender_only(fabric, rng):
    job = Job(fabric, fabric.hosts[:4])
    parts = [random_cells(rng) for _ in range(4)]
    for r in range(4):
        job.send(r, parts[r], slot=5, chunk=42)
    job.collect()
    counters = CounterDelta(fabric)
    job.send(2, parts[2], slot=5, chunk=42, flags=Flag.RETX)
    got = job.collect(timeout=1.0)
    assert [len(got[r]) for r in range(4)] == [0, 0, 1, 0]
    pkt = got[2][0]
    assert_result_frame(pkt, job, 2)
    assert pkt[Agg].flags == Flag.RESULT | Flag.RETX
    np.testing.assert_array_equal(result_cells(pkt), wrapped_sum(parts))
    assert counters.events() == {Event.RESENT: 1}


def test_many_rounds_reuse_slots_through_both_copies(fabric, rng):
    """A pool of 4 slots carries 24 chunks: chunk k uses slot k % 4, shadow (k // 4) % 2."""
    world, pool_size = 3, 4
    job = Job(fabric, fabric.hosts[:world], pool_size=pool_size)
    for k in range(24):
        parts = [random_cells(rng) for _ in range(world)]
        for r in range(world):
            job.send(r, parts[r], slot=k % pool_size, shadow=(k // pool_size) % 2, chunk=k)
        for pkts in job.collect().values():
            assert len(pkts) == 1 and pkts[0][Agg].chunk == k
            np.testing.assert_array_equal(result_cells(pkts[0]), wrapped_sum(parts))


def test_late_packet_of_an_older_round_is_stale(fabric, rng):
    job = Job(fabric, fabric.hosts[:2], pool_size=1)
    for chunk, shadow in ((0, 0), (1, 1), (2, 0)):
        for r in range(2):
            job.send(r, random_cells(rng), chunk=chunk, shadow=shadow)
        job.collect()
    counters = CounterDelta(fabric)
    job.send(1, random_cells(rng), chunk=0, shadow=0)  # delayed copy of chunk 0
    assert job.collect(timeout=QUIET)[1] == []
    assert counters.drops() == {DropReason.STALE: 1}


def test_two_jobs_at_once_never_mix(fabric, rng):
    a = Job(fabric, fabric.hosts[0:4])
    b = Job(fabric, fabric.hosts[4:8])
    pa = [random_cells(rng) for _ in range(4)]
    pb = [random_cells(rng) for _ in range(4)]
    for r in range(4):  # same slot, shadow and chunk numbers, interleaved
        a.send(r, pa[r], slot=1, chunk=9)
        b.send(r, pb[r], slot=1, chunk=9)
    for job, parts in ((a, pa), (b, pb)):
        for r, pkts in job.collect().items():
            assert len(pkts) == 1
            assert_result_frame(pkts[0], job, r)
            np.testing.assert_array_equal(result_cells(pkts[0]), wrapped_sum(parts))
