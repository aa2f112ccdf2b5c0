"""Two-level aggregation on the wire (docs/protocol.md, "Two-level aggregation"), with the
same expectations on every target: two leaves with two hosts each under one parent; a
leaf sends its completed copy up, the parent's result comes down and is multicast to the
leaf's workers. Loss anywhere is recovered by a worker's retransmission alone."""

from __future__ import annotations

import time
import zlib
from functools import reduce

import numpy as np
import pytest
from packet_checks import assert_result_frame, assert_routed_unchanged
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from homagg.lab.aggjob import CounterDelta, Job, result_cells
from homagg.lab.fabric import Fabric
from homagg.lab.poll import wait_for
from homagg.lab.rawsock import recv_frames
from homagg.lab.tree_fabric import TreeFabric, TreeLeaf
from homagg.lab.tree_job import TreeJob
from homagg.wire.constants import (
    AGG_UDP_PORT,
    CELLS_PER_PKT,
    RESULT_TTL,
    DropReason,
    Event,
    Flag,
    Op,
)
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import AggHeader
from homagg.wire.packer import pack_payload
from homagg.wire.scapy_layer import Agg

QUIET = 0.3  # seconds to wait before concluding that nothing more arrives
LANE_BITS = {Op.ADD: 32, Op.ADD16: 16, Op.ADD8: 8}


@pytest.fixture(scope="module")
def tree(target, tmp_path_factory):
    with TreeFabric(target, 2, 2, tmp_path_factory.mktemp(f"tree-{target}")) as t:
        yield t


@pytest.fixture(autouse=True)
def _quiet(tree):
    tree.drain()


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def any_cells(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(-(1 << 31), 1 << 31, CELLS_PER_PKT, dtype=np.int64).astype(np.int32)


def combined(op: int, parts: list[np.ndarray]) -> np.ndarray:
    """Oracle: OR, signed MAX, or each lane summed in Python ints modulo 2^bits."""
    if op == Op.OR:
        return reduce(np.bitwise_or, parts)
    if op == Op.MAX:
        return reduce(np.maximum, parts)
    bits = LANE_BITS[Op(op)]
    mask = (1 << bits) - 1
    out = np.zeros(CELLS_PER_PKT, np.int64)
    for shift in range(0, 32, bits):
        lanes = sum((p.view(np.uint32).astype(np.int64) >> shift) & mask for p in parts)
        out |= (lanes & mask) << shift
    return out.astype(np.uint32).view(np.int32)


def send_all(job, parts, ranks=None, **kw) -> None:
    for r in range(job.world_size) if ranks is None else ranks:
        job.send(r, parts[r], **kw)


def assert_one_result_each(job, got, parts, flags=Flag.RESULT, op=Op.ADD, **fields) -> None:
    expected = combined(op, parts)
    for r, pkts in got.items():
        assert len(pkts) == 1, f"rank {r} got {len(pkts)} results"
        assert_result_frame(pkts[0], job, r)
        assert pkts[0][Agg].flags == flags
        for name, value in fields.items():
            assert getattr(pkts[0][Agg], name) == value, name
        np.testing.assert_array_equal(result_cells(pkts[0]), expected)


def nothing_arrives(job, ranks=None, wait: float = QUIET) -> bool:
    """No frame reaches the ranks' hosts within one wait (for all of them at once). A wait
    of 0 checks what is there: enough once the switch has answered the last packet sent
    (a packet is dropped, absorbed, sent up or answered: never two of these)."""
    time.sleep(wait)
    hosts = [job.hosts[r] for r in (range(job.world_size) if ranks is None else ranks)]
    return all(not recv_frames(h.raw.sock) for h in hosts)


def counters(tree: TreeFabric) -> list[CounterDelta]:
    """The parent's counters, then each leaf's."""
    return [CounterDelta(f) for f in tree.switches()]


def events(deltas: list[CounterDelta]) -> list[dict[Event, int]]:
    return [d.events() for d in deltas]


def drops(deltas: list[CounterDelta]) -> list[dict[DropReason, int]]:
    return [d.drops() for d in deltas]


def wait_event(delta: CounterDelta, event: Event, count: int) -> None:
    wait_for(lambda: delta.events().get(event, 0) >= count, 5.0, f"{count} x {event.name}")


@pytest.mark.parametrize("shape", [(2, 2), (1, 1)], ids=["2x2", "2x1"])
@pytest.mark.parametrize("op", list(Op), ids=[op.name for op in Op])
def test_every_op_is_exact_through_the_tree(tree, rng, op, shape):
    job = TreeJob(tree, shape)
    parts = [any_cells(rng) for _ in range(job.world_size)]
    for r in range(job.world_size):
        job.send(r, parts[r], slot=3, shadow=1, chunk=7, exp=100 + r, op=op)
    assert_one_result_each(
        job, job.collect(), parts, op=op, slot=3, shadow=1, chunk=7, exp=100 + job.world_size - 1
    )


def assert_partial_frame(pkt: Ether, job: TreeJob, leaf: TreeLeaf, flags: int) -> None:
    """A partial goes from the leaf's service address to the parent's, as its uplink rank."""
    parent = job.tree.parent
    assert pkt[Ether].src == leaf.fabric.switch_mac and pkt[Ether].dst == parent.switch_mac
    assert pkt[IP].src == leaf.fabric.service_ip and pkt[IP].dst == parent.service_ip
    assert pkt[IP].ttl == RESULT_TTL
    assert (pkt[UDP].sport, pkt[UDP].dport, pkt[UDP].chksum) == (AGG_UDP_PORT, AGG_UDP_PORT, 0)
    ip_copy = pkt[IP].copy()
    del ip_copy.chksum
    assert IP(bytes(ip_copy))[IP].chksum == pkt[IP].chksum, "IPv4 checksum not recomputed"
    assert pkt[Agg].job_id == job.job_id and pkt[Agg].rank == job.uplink_rank(leaf)
    assert pkt[Agg].flags == flags


def test_a_leaf_sends_its_partial_up_as_one_contribution(tree, rng):
    job = TreeJob(tree, (2, 2))
    parts = [any_cells(rng) for _ in range(4)]
    deltas = counters(tree)
    for r in range(4):
        job.send(r, parts[r], slot=5, chunk=11, exp=10 * (r + 1))
    assert_one_result_each(job, job.collect(), parts, exp=40)
    for leaf in job.leaves:
        [frame] = leaf.tap.receive(1.0, count=1)
        partial = Ether(frame)
        assert_partial_frame(partial, job, leaf, flags=0)
        ranks = job.ranks_of(leaf)
        assert (partial[Agg].slot, partial[Agg].chunk) == (5, 11)
        assert partial[Agg].exp == 10 * (ranks[-1] + 1), "the leaf's MAX exponent"
        np.testing.assert_array_equal(
            result_cells(partial), combined(Op.ADD, [parts[r] for r in ranks])
        )
    assert events(deltas) == [
        {Event.CONTRIBUTION: 2, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 1, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 1, Event.RESULT: 1},
    ]
    assert drops(deltas) == [{}, {}, {}]


def test_a_lost_partial_goes_up_again_on_a_retransmission(tree, rng):
    job = TreeJob(tree, (2, 2))
    parts = [any_cells(rng) for _ in range(4)]
    parent, leaf0, _ = deltas = counters(tree)
    with tree.cut_up(0):
        send_all(job, parts, chunk=3)
        wait_event(leaf0, Event.PARTIAL, 1)
        wait_event(parent, Event.CONTRIBUTION, 1)
        assert nothing_arrives(job)
    assert events(deltas)[:2] == [
        {Event.CONTRIBUTION: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 1},
    ]
    job.send(1, parts[1], chunk=3, flags=Flag.RETX)
    assert_one_result_each(job, job.collect(), parts, chunk=3)
    [frame] = tree.leaves[0].tap.receive(1.0, count=1)
    assert_partial_frame(Ether(frame), job, tree.leaves[0], flags=Flag.RETX)
    assert events(deltas)[:2] == [
        {Event.CONTRIBUTION: 2, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 2, Event.RESULT: 1},
    ]
    assert drops(deltas) == [{}, {}, {}]


def test_a_lost_parent_result_comes_again_on_a_retransmission(tree, rng):
    job = TreeJob(tree, (2, 2))
    parts = [any_cells(rng) for _ in range(4)]
    parent, leaf0, _ = counters(tree)
    with tree.cut_down(0):
        send_all(job, parts, slot=1, chunk=1)
        assert_one_result_each(job, job.collect([2, 3]), parts)
        wait_event(parent, Event.RESULT, 1)
        assert nothing_arrives(job, [0, 1])
    assert leaf0.events() == {Event.CONTRIBUTION: 2, Event.PARTIAL: 1}
    resent = [CounterDelta(f) for f in tree.switches()]
    job.send(0, parts[0], slot=1, chunk=1, flags=Flag.RETX)
    # The parent resends its result to leaf 0, which multicasts it to both its workers.
    assert_one_result_each(job, job.collect([0, 1]), parts, slot=1, chunk=1)
    assert nothing_arrives(job, [2, 3], wait=0), "the parent resent to leaf 0 alone"
    assert events(resent) == [
        {Event.RESENT: 1},
        {Event.PARTIAL: 1, Event.RESULT: 1},
        {},
    ]
    assert drops(resent) == [{}, {}, {}]


def test_a_lost_leaf_result_is_resent_to_that_worker_only(tree, rng):
    job = TreeJob(tree, (2, 2))
    parts = [any_cells(rng) for _ in range(4)]
    send_all(job, parts, slot=2, chunk=2)
    job.collect()  # rank 2's copy counts as lost
    tree.drain()
    deltas = counters(tree)
    job.send(2, parts[2], slot=2, chunk=2, flags=Flag.RETX)
    got = job.collect([2])
    assert_one_result_each(job, got, parts, flags=Flag.RESULT | Flag.RETX)
    assert nothing_arrives(job, wait=0)
    assert events(deltas) == [{}, {}, {Event.RESENT: 1}]
    assert recv_frames(tree.leaves[1].tap.sock) == [], "the leaf answers from its final copy"


def test_duplicates_at_both_levels_are_dropped(tree, rng):
    """A duplicate before the leaf completes is dropped there; one after it completed
    re-sends the partial, which the parent (still waiting for the other leaf) drops."""
    job = TreeJob(tree, (2, 2))
    parts = [any_cells(rng) for _ in range(4)]
    parent, leaf0, _ = deltas = counters(tree)
    job.send(0, parts[0])
    job.send(0, parts[0], flags=Flag.RETX)
    # Frames of different ports may be taken in out of order (BMv2): one step at a time.
    wait_for(lambda: leaf0.drops(), 5.0, "the leaf's drop of the duplicate")
    job.send(1, parts[1])
    wait_event(parent, Event.CONTRIBUTION, 1)
    job.send(1, parts[1], flags=Flag.RETX)
    wait_for(lambda: parent.drops(), 5.0, "the parent's drop of the re-sent partial")
    assert nothing_arrives(job, wait=0)
    job.send(3, parts[3])
    job.send(2, parts[2])
    assert_one_result_each(job, job.collect(), parts)
    assert nothing_arrives(job)
    assert events(deltas) == [
        {Event.CONTRIBUTION: 2, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 2, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 1, Event.RESULT: 1},
    ]
    assert drops(deltas) == [{DropReason.DUPLICATE: 1}, {DropReason.DUPLICATE: 1}, {}]


def test_reordered_rounds_reuse_both_copies_at_both_levels(tree, rng):
    """A pool of 4 carries 16 chunks (every copy twice, a final copy reused by FRESH); each
    window of 4 chunks is sent in a shuffled order of ranks and chunks."""
    pool = 4
    job = TreeJob(tree, (2, 2), pool_size=pool)
    for window in range(4):
        chunks = range(window * pool, (window + 1) * pool)
        parts = {k: [any_cells(rng) for _ in range(4)] for k in chunks}
        sends = [(k, r) for k in chunks for r in range(4)]
        for i in rng.permutation(len(sends)):
            k, r = sends[i]
            job.send(r, parts[k][r], slot=k % pool, shadow=(k // pool) % 2, chunk=k)
        for r, pkts in job.collect(per_rank=pool).items():
            assert sorted(p[Agg].chunk for p in pkts) == list(chunks), f"rank {r}"
            for p in pkts:
                assert_result_frame(p, job, r)
                np.testing.assert_array_equal(
                    result_cells(p), combined(Op.ADD, parts[p[Agg].chunk])
                )


def result_from_parent(job: TreeJob, leaf: TreeLeaf, cells: np.ndarray, **fields: int) -> bytes:
    """A result frame as the parent would send it to `leaf` (fields override the header's)."""
    parent = job.tree.parent
    template = FrameTemplate(
        parent.switch_mac,
        leaf.fabric.switch_mac,
        parent.service_ip,
        leaf.fabric.service_ip,
        AGG_UDP_PORT,
    )
    header = dict(
        job_id=job.job_id, slot=0, shadow=0, rank=job.uplink_rank(leaf), op=Op.ADD, chunk=0
    )
    header.update(flags=Flag.RESULT, **fields)
    return template.frame(pack_payload(AggHeader(**header), cells))


@pytest.fixture(scope="module")
def stray(tree):
    """A tree job whose slot 2 holds chunk 5's result and whose slot 1 waits for chunk 1
    (only rank 0 in), and a flat job on leaf 0 (no uplink entry)."""
    job = TreeJob(tree, (2, 2))
    flat = Job(tree.leaves[0].fabric, tree.leaves[0].hosts)
    cells = np.arange(CELLS_PER_PKT, dtype=np.int32)
    send_all(job, [cells] * 4, slot=2, chunk=5)
    job.collect()
    job.send(0, cells, slot=1, chunk=1)
    return job, flat


STRAY = {
    # (where it comes from: the uplink tap or rank 0's host, header fields, drop reason)
    "result from a worker port": ("host", {"slot": 2, "chunk": 5}, DropReason.WRONG_PORT),
    "result for a job without uplink": ("tap", {"flat": 1}, DropReason.BAD_HEADER),
    "result with another rank": ("tap", {"slot": 2, "chunk": 5, "rank": 1}, DropReason.BAD_RANK),
    "result for an open copy": ("tap", {"slot": 1, "chunk": 1}, DropReason.STALE),
    "result for another chunk": ("tap", {"slot": 2, "chunk": 13}, DropReason.STALE),
    "result outside the pool": ("tap", {"slot": 16}, DropReason.SLOT_OUT_OF_POOL),
    "second result": ("tap", {"slot": 2, "chunk": 5}, DropReason.DUPLICATE),
    "result for an unknown job": ("tap", {"job_id": 60000}, DropReason.UNKNOWN_JOB),
}


@pytest.mark.parametrize("case", sorted(STRAY))
def test_stray_result_is_dropped_by_reason(tree, stray, case):
    job, flat = stray
    source, fields, reason = STRAY[case]
    fields = dict(fields)
    leaf = tree.leaves[0]
    if fields.pop("flat", 0):
        fields = {"job_id": flat.job_id}
    frame = result_from_parent(job, leaf, np.ones(CELLS_PER_PKT, np.int32), **fields)
    deltas = counters(tree)
    (leaf.tap if source == "tap" else leaf.hosts[0].raw).send(frame)
    # A parent that sees the frame too drops it: it comes from the parent's own address.
    echo = {DropReason.WRONG_PORT: 1} if tree.tap_echo and source == "tap" else {}
    expected = [echo, {reason: 1}, {}]
    wait_for(lambda: drops(deltas) == expected, 5.0, f"drops {expected}")
    assert nothing_arrives(job, [0, 1], wait=0)


@pytest.mark.parametrize("claimed", ["parent", "leaf", "sibling"])
def test_a_frame_from_a_service_address_of_the_tree_is_dropped_at_a_host_port(tree, claimed):
    """A host of leaf 0 that claims a service address of the tree as its source (to feed a
    worker of leaf 0 forged results) is dropped as WRONG_PORT: the parent's and leaf 1's
    come in only on the uplink port, leaf 0's own never."""
    leaf, sender, target = tree.leaves[0], tree.leaves[0].hosts[0], tree.leaves[0].hosts[1]
    source = {"parent": tree.parent, "leaf": leaf.fabric, "sibling": tree.leaves[1].fabric}
    header = AggHeader(1, slot=0, shadow=0, rank=0, op=Op.ADD, chunk=0, flags=Flag.RESULT)
    forged = FrameTemplate(
        sender.mac, leaf.fabric.switch_mac, source[claimed].service_ip, target.ip, AGG_UDP_PORT
    ).frame(pack_payload(header, np.arange(CELLS_PER_PKT, dtype=np.int32)))
    deltas = counters(tree)
    sender.raw.send(forged)
    expected = [{}, {DropReason.WRONG_PORT: 1}, {}]
    wait_for(lambda: drops(deltas) == expected, 5.0, f"drops {expected}")
    # Counted as dropped, so never routed: what the target has is all it gets.
    assert recv_frames(target.raw.sock) == [], "the forgery reached the worker's host"
    assert events(deltas) == [{}, {}, {}]


def test_stray_results_leave_the_open_round_exact(tree, stray):
    job, _ = stray
    leaf = tree.leaves[0]
    leaf0 = CounterDelta(leaf.fabric)
    for fields in ({"slot": 1, "chunk": 1}, {"slot": 2, "chunk": 5}, {"slot": 2, "chunk": 9}):
        leaf.tap.send(result_from_parent(job, leaf, np.full(CELLS_PER_PKT, 7, np.int32), **fields))
    # Taken in before the round completes (another port's frames may overtake them).
    wait_for(lambda: sum(leaf0.drops().values()) == 3, 5.0, "the leaf's drops of the results")
    assert leaf0.drops() == {DropReason.STALE: 2, DropReason.DUPLICATE: 1}
    cells = [np.arange(CELLS_PER_PKT, dtype=np.int32)] * 4
    send_all(job, cells, [1, 2, 3], slot=1, chunk=1)
    assert_one_result_each(job, job.collect(), cells, slot=1, chunk=1)


def test_a_result_flagged_frame_routed_down_the_uplink_is_no_result(tree):
    """A frame the parent would route to a host of leaf 0 (a datagram from a host of leaf 1
    to port 40700) that claims to be a result for leaf 0's rank 0 comes in on the uplink
    port; leaf 0 routes it to the host it is addressed to, as sent: only results its
    aggregation emitted are delivered."""
    job = TreeJob(tree, (2, 2))
    leaf, sender = tree.leaves[0], tree.leaves[1].hosts[0]
    target = leaf.hosts[1]
    header = AggHeader(job.job_id, slot=0, shadow=0, rank=0, op=Op.ADD, chunk=0, flags=Flag.RESULT)
    template = FrameTemplate(
        tree.parent.switch_mac, leaf.fabric.switch_mac, sender.ip, target.ip, AGG_UDP_PORT
    )
    sent = template.frame(pack_payload(header, np.arange(CELLS_PER_PKT, dtype=np.int32)))
    deltas = counters(tree)
    leaf.tap.send(sent)
    got = target.raw.receive(2.0, count=1)
    assert len(got) == 1, "the frame did not reach the host it was addressed to"
    assert_routed_unchanged(got[0], sent, leaf.fabric.switch_mac, target.mac)
    assert nothing_arrives(job, [0], wait=0), "delivered as a result to rank 0"
    # The parent has no route to a leaf's hosts here: what a tap's echo reaches it drops.
    echo = {DropReason.NO_ROUTE: 1} if tree.tap_echo else {}
    wait_for(lambda: drops(deltas) == [echo, {}, {}], 5.0, f"drops {[echo, {}, {}]}")
    assert events(deltas) == [{}, {}, {}]


def by_job(pkts: list[Ether]) -> dict[int, Ether]:
    out = {p[Agg].job_id: p for p in pkts}
    assert len(out) == len(pkts), "two results of one job"
    return out


def test_a_flat_job_on_a_leaf_beside_a_tree_job_behaves_as_on_one_switch(tree, rng):
    leaf = tree.leaves[0]
    flat = Job(leaf.fabric, leaf.hosts)
    job = TreeJob(tree, (2, 2))
    flat_parts = [any_cells(rng) for _ in range(2)]
    parts = [any_cells(rng) for _ in range(4)]
    parent, leaf0, _ = counters(tree)
    for r in range(2):  # the same slot, shadow and chunk in both jobs, interleaved
        flat.send(r, flat_parts[r], slot=1, chunk=9)
        job.send(r, parts[r], slot=1, chunk=9)
    send_all(job, parts, [2, 3], slot=1, chunk=9)
    got = flat.collect(per_rank=2)
    for r in range(2):
        results = by_job(got[r])
        assert_one_result_each(flat, {r: [results[flat.job_id]]}, flat_parts)
        assert_one_result_each(job, {r: [results[job.job_id]]}, parts)
    assert len(leaf.tap.receive(1.0, count=1)) == 1
    assert recv_frames(leaf.tap.sock) == [], "only the tree job's partial goes up"
    assert leaf0.events() == {Event.CONTRIBUTION: 4, Event.PARTIAL: 1, Event.RESULT: 2}
    assert parent.events() == {Event.CONTRIBUTION: 2, Event.RESULT: 1}
    flat.send(1, flat_parts[1], slot=1, chunk=9, flags=Flag.RETX)
    assert_one_result_each(
        flat, flat.collect([1], timeout=1.0), flat_parts, flags=Flag.RESULT | Flag.RETX
    )
    assert recv_frames(leaf.tap.sock) == [], "a flat job's retransmission never goes up"
    assert leaf0.drops() == {} and parent.drops() == {}


def test_the_fabric_keeps_every_switch_in_its_own_subnet(tree):
    fabrics: list[Fabric] = tree.switches()
    assert len({f.service_ip for f in fabrics}) == len({f.switch_mac for f in fabrics}) == 3
    assert {h.ip.rsplit(".", 1)[0] for h in tree.leaves[1].hosts} == {"10.0.2"}
