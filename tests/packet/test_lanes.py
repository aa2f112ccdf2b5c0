"""Lane ops ADD16 and ADD8 on the wire (docs/protocol.md, "Lanes"), identical for BMv2 and
the reference switch: every lane of a cell adds and wraps on its own."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from homagg.lab.aggjob import CounterDelta, Job, random_cells, result_cells, wrapped_sum
from homagg.lab.fabric import Fabric
from homagg.wire.constants import CELLS_PER_PKT, DropReason, Event, Flag, Op
from homagg.wire.scapy_layer import Agg

QUIET = 0.3  # seconds to wait before concluding that nothing more arrives
BITS = {Op.ADD16: 16, Op.ADD8: 8}


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 4, tmp_path_factory.mktemp(target)) as f:
        yield f


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def lane_sum(parts: list[np.ndarray], bits: int) -> np.ndarray:
    """Oracle: each bits-wide lane of the cells summed in Python ints modulo 2^bits."""
    mask = (1 << bits) - 1
    out = []
    for cells in zip(*(p.tolist() for p in parts)):
        cell = 0
        for lane in range(32 // bits):
            s = sum((c >> (bits * lane)) & mask for c in cells) & mask
            cell |= s << (bits * lane)
        out.append(cell - (1 << 32) if cell >= 1 << 31 else cell)
    return np.array(out, np.int32)


def cells_of_lanes(lanes: list[int], bits: int) -> np.ndarray:
    """Cells whose every cell holds the signed `lanes` (lane 0 lowest bits)."""
    cell = sum((v & ((1 << bits) - 1)) << (bits * i) for i, v in enumerate(lanes))
    return np.full(CELLS_PER_PKT, cell, np.uint32).view(np.int32)


def any_cells(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(-(1 << 31), 1 << 31, CELLS_PER_PKT, dtype=np.int64).astype(np.int32)


@pytest.mark.parametrize("op", [Op.ADD16, Op.ADD8])
@pytest.mark.parametrize("world", [2, 4])
def test_lane_sums_of_random_cells(fabric, rng, op, world):
    """Random cells cover negative lanes and lanes that wrap; the exponent is still MAX."""
    job = Job(fabric, fabric.hosts[:world])
    parts = [any_cells(rng) for _ in range(world)]
    counters = CounterDelta(fabric)
    for r in range(world):
        job.send(r, parts[r], op=op, slot=2, exp=10 + r)
    expected = lane_sum(parts, BITS[op])
    for r, pkts in job.collect().items():
        assert len(pkts) == 1, f"rank {r} got {len(pkts)} results"
        assert pkts[0][Agg].exp == 10 + world - 1
        np.testing.assert_array_equal(result_cells(pkts[0]), expected)
    assert counters.events() == {Event.CONTRIBUTION: world, Event.RESULT: 1}
    assert counters.drops() == {}


@pytest.mark.parametrize(
    "op, a, b, expected",
    [
        # -1 + 1 in every lane: 0 everywhere, where a 32-bit ADD would carry into lane 1.
        (Op.ADD16, [-1, -1], [1, 1], [0, 0]),
        (Op.ADD8, [-1, -1, -1, -1], [1, 1, 1, 1], [0, 0, 0, 0]),
        # Lane maxima + 1 wrap to the lane minimum, each lane alone.
        (Op.ADD16, [32767, 5], [1, -7], [-32768, -2]),
        (Op.ADD8, [127, -128, 100, 0], [1, -1, 100, -1], [-128, 127, -56, -1]),
        # Negative sums in the high lane (the cell's sign bit) leave the low lane alone.
        (Op.ADD16, [3, -20000], [4, -20000], [7, 25536]),
    ],
)
def test_each_lane_wraps_alone(fabric, op, a, b, expected):
    job = Job(fabric, fabric.hosts[:2])
    bits = BITS[op]
    job.send(0, cells_of_lanes(a, bits), op=op)
    job.send(1, cells_of_lanes(b, bits), op=op)
    want = cells_of_lanes(expected, bits)
    for _r, pkts in job.collect().items():
        np.testing.assert_array_equal(result_cells(pkts[0]), want)


def test_mixed_lane_widths_in_different_slots(fabric, rng):
    """ADD, ADD16 and ADD8 rounds interleaved in three slots of one job."""
    job = Job(fabric, fabric.hosts[:3])
    ops = {0: Op.ADD, 1: Op.ADD16, 2: Op.ADD8}
    parts = {s: [any_cells(rng) for _ in range(3)] for s in ops}
    for r in range(3):
        for s, op in ops.items():
            job.send(r, parts[s][r], op=op, slot=s, chunk=s)
    got = job.collect(per_rank=3)
    for r in range(3):
        by_slot = {p[Agg].slot: result_cells(p) for p in got[r]}
        assert sorted(by_slot) == [0, 1, 2], f"rank {r}"
        np.testing.assert_array_equal(by_slot[0], wrapped_sum(parts[0]))
        np.testing.assert_array_equal(by_slot[1], lane_sum(parts[1], 16))
        np.testing.assert_array_equal(by_slot[2], lane_sum(parts[2], 8))


def test_slot_reused_with_another_op_after_completion(fabric, rng):
    """Chunk k (ADD8) and chunk k + 2S (ADD16, then ADD) through the same slot copy: the
    first packet of a newer round overwrites whatever op filled the copy before."""
    pool = 2
    job = Job(fabric, fabric.hosts[:2], pool_size=pool)
    for k, op in [(0, Op.ADD8), (2 * pool, Op.ADD16), (4 * pool, Op.ADD)]:
        parts = [any_cells(rng) for _ in range(2)]
        for r in range(2):
            job.send(r, parts[r], op=op, slot=0, shadow=(k // pool) % 2, chunk=k)
        want = wrapped_sum(parts) if op == Op.ADD else lane_sum(parts, BITS[op])
        for _r, pkts in job.collect().items():
            assert pkts[0][Agg].chunk == k
            np.testing.assert_array_equal(result_cells(pkts[0]), want)


@pytest.mark.parametrize("op", [Op.ADD16, Op.ADD8])
def test_duplicate_and_retransmission_as_for_add(fabric, rng, op):
    job = Job(fabric, fabric.hosts[:3])
    parts = [random_cells(rng) for _ in range(3)]
    counters = CounterDelta(fabric)
    job.send(0, parts[0], op=op, slot=6, chunk=9)
    job.send(0, parts[0], op=op, slot=6, chunk=9)  # duplicate while the round is open
    job.send(1, parts[1], op=op, slot=6, chunk=9)
    assert all(not v for v in job.collect(timeout=QUIET).values())
    job.send(2, parts[2], op=op, slot=6, chunk=9)
    expected = lane_sum(parts, BITS[op])
    for _r, pkts in job.collect().items():
        np.testing.assert_array_equal(result_cells(pkts[0]), expected)
    assert counters.drops() == {DropReason.DUPLICATE: 1}
    job.send(1, parts[1], op=op, slot=6, chunk=9, flags=Flag.RETX)
    got = job.collect(timeout=1.0)
    assert [len(got[r]) for r in range(3)] == [0, 1, 0]
    assert got[1][0][Agg].flags == Flag.RESULT | Flag.RETX
    np.testing.assert_array_equal(result_cells(got[1][0]), expected)
    assert counters.events()[Event.RESENT] == 1


@pytest.mark.parametrize("op", [Op.ADD16, Op.ADD8])
def test_late_lane_packet_of_an_older_round_is_stale(fabric, rng, op):
    """A delayed lane packet of chunk 0 arriving after chunk 2 reused its slot copy is
    dropped as STALE and leaves the newer round's sum alone (a resend returns it intact)."""
    job = Job(fabric, fabric.hosts[:2], pool_size=1)
    parts = {}
    for chunk, shadow in ((0, 0), (1, 1), (2, 0)):
        parts[chunk] = [any_cells(rng) for _ in range(2)]
        for r in range(2):
            job.send(r, parts[chunk][r], op=op, chunk=chunk, shadow=shadow)
        for pkts in job.collect().values():
            assert len(pkts) == 1 and pkts[0][Agg].chunk == chunk
    counters = CounterDelta(fabric)
    job.send(1, parts[0][1], op=op, chunk=0, shadow=0)  # the delayed copy of chunk 0
    assert job.collect(timeout=QUIET)[1] == []
    assert counters.drops() == {DropReason.STALE: 1}
    job.send(0, parts[2][0], op=op, chunk=2, shadow=0, flags=Flag.RETX)
    got = job.collect(ranks=[0])[0]
    assert len(got) == 1 and got[0][Agg].chunk == 2
    np.testing.assert_array_equal(result_cells(got[0]), lane_sum(parts[2], BITS[op]))


@pytest.mark.parametrize("op", [Op.ADD16, Op.ADD8])
@pytest.mark.parametrize("ncells", [1, 37, CELLS_PER_PKT - 1])
def test_partial_packet_of_lanes(fabric, rng, op, ncells):
    """A last chunk with fewer meaningful cells (ncells < CELLS_PER_PKT, the rest zero as
    the transport pads it): its lanes sum like a full packet's, the padding stays zero and
    the result carries the same ncells."""
    job = Job(fabric, fabric.hosts[:3])
    parts = []
    for _ in range(3):
        cells = any_cells(rng)
        cells[ncells:] = 0
        parts.append(cells)
    counters = CounterDelta(fabric)
    for r in range(3):
        job.send(r, parts[r], op=op, slot=3, chunk=5, ncells=ncells)
    expected = lane_sum(parts, BITS[op])
    assert not expected[ncells:].any()
    for r, pkts in job.collect().items():
        assert len(pkts) == 1, f"rank {r} got {len(pkts)} results"
        assert pkts[0][Agg].ncells == ncells
        np.testing.assert_array_equal(result_cells(pkts[0]), expected)
    assert counters.events() == {Event.CONTRIBUTION: 3, Event.RESULT: 1}
    assert counters.drops() == {}
