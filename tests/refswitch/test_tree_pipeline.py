"""Two-level aggregation in the reference switch, in-process (no root, no sockets): the slot
state's final bit and the verdicts at the edges, then two leaves and a parent whose
pipelines the test wires together by hand, with entries written over real P4Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from homagg.control.aggregation import JobEntries, Uplink, Worker
from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.forwarding import Host, forwarding_entries
from homagg.control.install import install_job, reconcile
from homagg.control.switch_connection import SwitchConnection
from homagg.lab.addresses import host_ip, host_mac, service_ip, switch_mac
from homagg.refswitch import aggregation as agg_mod
from homagg.refswitch.aggregation import AggregationRegisters, accept_result, update_slot
from homagg.refswitch.packet import AggH, Metadata
from homagg.refswitch.pipeline import Pipeline
from homagg.refswitch.switch import ReferenceSwitch
from homagg.wire.constants import (
    AGG_UDP_PORT,
    CELLS_PER_PKT,
    SLOT_COUNT_MASK,
    SLOT_FINAL,
    DropReason,
    Event,
    Flag,
    Op,
)
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import AggHeader
from homagg.wire.packer import pack_payload
from homagg.wire.scapy_layer import Agg

JOB = 7
UPLINK = 100  # each leaf's port toward the parent; the parent's port toward leaf k is k + 1


def header(**fields: int) -> AggH:
    base = dict(version=1, flags=0, op=Op.ADD, rank=0, job_id=JOB, slot=0, shadow=0, exp=0)
    return AggH(**(base | dict(ncells=CELLS_PER_PKT, chunk=1) | fields))


def complete_copy(regs: AggregationRegisters, has_uplink: int, workers: int = 2) -> Metadata:
    """Slot copy 0 filled by every one of `workers` workers of chunk 1."""
    for w in range(workers):
        meta = Metadata(num_workers=workers, worker_bit=1 << w, has_uplink=has_uplink)
        update_slot(regs, header(rank=w, exp=w), meta)
    return meta


@pytest.mark.parametrize("has_uplink", [0, 1])
def test_a_complete_copy_resends_up_until_final_then_to_the_worker(has_uplink):
    regs = AggregationRegisters()
    meta = complete_copy(regs, has_uplink)
    assert regs.count[0] == 2 and meta.verdict == agg_mod.VERDICT_COMBINE
    update_slot(regs, header(), meta)
    assert meta.verdict == (agg_mod.VERDICT_RESEND_UP if has_uplink else agg_mod.VERDICT_RESEND)
    if not has_uplink:
        return
    accept_result(regs, header(flags=Flag.RESULT, exp=9), meta)
    assert meta.drop_reason == DropReason.NONE
    assert regs.count[0] == 2 | SLOT_FINAL and regs.exp[0] == 9 and regs.seen[0] == 0b11
    update_slot(regs, header(), meta)
    assert meta.verdict == agg_mod.VERDICT_RESEND and meta.count == 2 | SLOT_FINAL
    assert header().exp == 0 and regs.count[0] & SLOT_COUNT_MASK == 2


def test_a_newer_chunk_clears_the_final_bit():
    regs = AggregationRegisters()
    meta = complete_copy(regs, 1)
    accept_result(regs, header(flags=Flag.RESULT), meta)
    update_slot(regs, header(chunk=3), meta)
    assert meta.verdict == agg_mod.VERDICT_FRESH and regs.count[0] == 1


@pytest.mark.parametrize(
    "fields, workers_in, reason",
    [
        ({}, 2, DropReason.NONE),
        ({"chunk": 2}, 2, DropReason.STALE),  # another chunk in the copy
        ({"job_id": JOB + 1}, 2, DropReason.STALE),  # another job in the copy
        ({}, 1, DropReason.STALE),  # the copy still open
    ],
)
def test_accept_result_takes_only_the_awaited_copy(fields, workers_in, reason):
    regs = AggregationRegisters()
    meta = complete_copy(regs, 1, workers=workers_in)
    meta.num_workers = 2
    count = regs.count[0]
    accept_result(regs, header(flags=Flag.RESULT, **fields), meta)
    assert meta.drop_reason == reason
    if reason == DropReason.NONE:
        accept_result(regs, header(flags=Flag.RESULT), meta)
        assert meta.drop_reason == DropReason.DUPLICATE
    else:
        assert regs.count[0] == count, "a refused result leaves the copy as it was"


class Switch:
    """One in-process reference switch with its subnet's forwarding entries."""

    def __init__(self, subnet: int, hosts: int) -> None:
        self.sw = ReferenceSwitch({}, "127.0.0.1:0")
        self.conn = SwitchConnection(f"127.0.0.1:{self.sw.start()}")
        self.conn.connect()
        self.conn.set_pipeline(P4INFO_PATH, BMV2_JSON_PATH)
        self.ip, self.mac = service_ip(subnet), switch_mac(subnet)
        self.hosts = [Host(host_ip(i, subnet), host_mac(i), i + 1) for i in range(hosts)]
        reconcile(self.conn, forwarding_entries(self.hosts, self.ip, self.mac), read_back=False)
        self.pipe = Pipeline(self.sw.device)

    def events(self) -> dict[int, int]:
        counter = self.sw.device.counter("SwitchIngress.aggregation.event_counter")
        return {i: counter.read(i)[0] for i in range(4) if counter.read(i)[0]}

    def drops(self) -> dict[int, int]:
        counter = self.sw.device.counter("SwitchIngress.drop_counter")
        return {i: counter.read(i)[0] for i in range(16) if counter.read(i)[0]}

    def close(self) -> None:
        self.conn.close()
        self.sw.close()


@pytest.fixture(scope="module")
def tree():
    """A parent (subnet 0) and two leaves (subnets 1, 2) with two hosts each; job JOB with
    ranks 0, 1 on leaf 0 and 2, 3 on leaf 1, its entries in the order of the design."""
    parent, leaves = Switch(0, 0), [Switch(1, 2), Switch(2, 2)]
    try:
        install_job(
            parent.conn,
            JobEntries(
                JOB,
                40,
                4,
                JOB,
                tuple(Worker(u, u + 1, lf.mac, lf.ip, AGG_UDP_PORT) for u, lf in enumerate(leaves)),
            ),
        )
        for u, leaf in enumerate(leaves):
            workers = tuple(
                Worker(2 * u + i, h.switch_port, h.mac, h.ip, 41000 + 2 * u + i)
                for i, h in enumerate(leaf.hosts)
            )
            uplink = Uplink(UPLINK, u, parent.ip, parent.mac)
            install_job(leaf.conn, JobEntries(JOB, 8, 4, JOB, workers, uplink))
        yield parent, leaves
    finally:
        for s in (parent, *leaves):
            s.close()


def contribution(leaf: Switch, rank: int, cells: np.ndarray, **fields: int) -> bytes:
    h = leaf.hosts[rank % 2]
    head = dict(job_id=JOB, slot=1, shadow=0, rank=rank, op=Op.ADD, chunk=5) | fields
    template = FrameTemplate(h.mac, leaf.mac, h.ip, leaf.ip, 41000 + rank)
    return template.frame(pack_payload(AggHeader(**head), cells))


def test_two_leaves_and_a_parent_sum_exactly_and_recover_a_lost_partial(tree):
    parent, leaves = tree
    parts = [np.full(CELLS_PER_PKT, 10**r, np.int32) for r in range(4)]
    assert leaves[0].pipe.process(1, contribution(leaves[0], 0, parts[0])) == []
    [(port, partial)] = leaves[0].pipe.process(2, contribution(leaves[0], 1, parts[1]))
    pkt = Ether(partial)
    assert port == UPLINK and pkt[Agg].flags == 0 and pkt[Agg].rank == 0
    assert (pkt[Ether].src, pkt[Ether].dst) == (leaves[0].mac, parent.mac)
    assert (pkt[IP].src, pkt[IP].dst, pkt[IP].ttl) == (leaves[0].ip, parent.ip, 64)
    assert (pkt[UDP].sport, pkt[UDP].dport, pkt[UDP].chksum) == (AGG_UDP_PORT, AGG_UDP_PORT, 0)
    assert pkt[Agg].cells == [11] * CELLS_PER_PKT
    # Leaf 0's partial is lost; leaf 1's reaches the parent.
    leaves[1].pipe.process(1, contribution(leaves[1], 2, parts[2]))
    [(_, up1)] = leaves[1].pipe.process(2, contribution(leaves[1], 3, parts[3]))
    assert parent.pipe.process(2, up1) == []
    # Rank 0 retransmits: the partial goes up again and completes the parent's round.
    [(_, again)] = leaves[0].pipe.process(1, contribution(leaves[0], 0, parts[0], flags=2))
    assert Ether(again)[Agg].flags == Flag.RETX
    results = parent.pipe.process(1, again)
    assert sorted(p for p, _ in results) == [1, 2]
    for port, frame in results:
        leaf = leaves[port - 1]
        pkt = Ether(frame)
        assert pkt[Agg].flags == Flag.RESULT and pkt[Agg].rank == port - 1
        assert (pkt[IP].dst, pkt[UDP].dport, pkt[Ether].dst) == (leaf.ip, AGG_UDP_PORT, leaf.mac)
        copies = leaf.pipe.process(UPLINK, frame)
        assert sorted(p for p, _ in copies) == [1, 2]
        for p, copy in copies:
            got = Ether(copy)
            assert got[IP].dst == leaf.hosts[p - 1].ip and got[Agg].rank == 2 * (port - 1) + p - 1
            assert got[Agg].flags == Flag.RESULT and got[Agg].cells == [1111] * CELLS_PER_PKT
    assert leaves[0].events() == {Event.CONTRIBUTION: 2, Event.RESULT: 1, Event.PARTIAL: 2}
    assert parent.events() == {Event.CONTRIBUTION: 2, Event.RESULT: 1}
    # The leaf answers a later retransmission from its final copy; a second result is refused.
    [(port, resent)] = leaves[0].pipe.process(2, contribution(leaves[0], 1, parts[1], flags=2))
    assert port == 2 and Ether(resent)[Agg].flags == Flag.RESULT | Flag.RETX
    assert leaves[0].pipe.process(UPLINK, results[0][1]) == []
    assert leaves[0].drops() == {DropReason.DUPLICATE: 1}


def test_results_from_elsewhere_are_dropped_by_reason(tree):
    parent, leaves = tree
    leaf = leaves[0]
    down = FrameTemplate(parent.mac, leaf.mac, parent.ip, leaf.ip, AGG_UDP_PORT)

    def forged(template: FrameTemplate = down, **fields: int) -> bytes:
        head = dict(job_id=JOB, slot=2, shadow=0, rank=0, op=Op.ADD, chunk=5, flags=1) | fields
        return template.frame(pack_payload(AggHeader(**head), np.ones(CELLS_PER_PKT, np.int32)))

    cases = [
        (1, forged(), DropReason.WRONG_PORT),
        (UPLINK, forged(rank=1), DropReason.BAD_RANK),
        (UPLINK, forged(slot=4), DropReason.SLOT_OUT_OF_POOL),
        (UPLINK, forged(), DropReason.STALE),  # nothing awaited in slot 2's copy
        (UPLINK, forged(job_id=99), DropReason.UNKNOWN_JOB),
        (UPLINK, forged(version=2), DropReason.BAD_HEADER),
    ]
    for port, frame, reason in cases:
        before = leaf.drops().get(reason, 0)
        assert leaf.pipe.process(port, frame) == []
        assert leaf.drops().get(reason, 0) == before + 1, reason
    # On the parent (no uplink entry for the job), a result is a bad header, as on one switch.
    up = FrameTemplate(leaf.mac, parent.mac, leaf.ip, parent.ip, AGG_UDP_PORT)
    assert parent.pipe.process(1, forged(up)) == []
    assert parent.drops() == {DropReason.BAD_HEADER: 1}


def test_three_levels_fall_out_of_the_same_rules():
    """A parent with an uplink entry of its own is a leaf of the switch above it: the
    partial climbs two levels and the result comes down through both."""
    top, mid, leaf = Switch(0, 0), Switch(3, 0), Switch(4, 2)
    try:
        job = JOB + 1
        install_job(
            top.conn, JobEntries(job, 0, 2, job, (Worker(0, 1, mid.mac, mid.ip, AGG_UDP_PORT),))
        )
        below = (Worker(0, 1, leaf.mac, leaf.ip, AGG_UDP_PORT),)
        install_job(mid.conn, JobEntries(job, 0, 2, job, below, Uplink(UPLINK, 0, top.ip, top.mac)))
        workers = tuple(
            Worker(i, h.switch_port, h.mac, h.ip, 41000 + i) for i, h in enumerate(leaf.hosts)
        )
        install_job(
            leaf.conn, JobEntries(job, 0, 2, job, workers, Uplink(UPLINK, 0, mid.ip, mid.mac))
        )
        parts = [np.full(CELLS_PER_PKT, 3 + r, np.int32) for r in range(2)]
        leaf.pipe.process(1, contribution(leaf, 0, parts[0], job_id=job, slot=0))
        [(_, up)] = leaf.pipe.process(2, contribution(leaf, 1, parts[1], job_id=job, slot=0))
        [(port, up2)] = mid.pipe.process(1, up)
        assert port == UPLINK and Ether(up2)[IP].dst == top.ip and Ether(up2)[Agg].rank == 0
        [(port, down)] = top.pipe.process(1, up2)
        [(port, down2)] = mid.pipe.process(UPLINK, down)
        assert port == 1 and Ether(down2)[IP].dst == leaf.ip
        copies = leaf.pipe.process(UPLINK, down2)
        assert sorted(p for p, _ in copies) == [1, 2]
        assert all(Ether(f)[Agg].cells == [7] * CELLS_PER_PKT for _, f in copies)
        assert mid.events() == {Event.CONTRIBUTION: 1, Event.PARTIAL: 1, Event.RESULT: 1}
    finally:
        for s in (top, mid, leaf):
            s.close()
