"""Aggregation (p4src/aggregation.p4): validate a contribution, find the job's pool and
the worker's bit, classify it against its slot copy and combine the cells; at a leaf of a
two-level job (an uplink entry), send a completed copy up and take the parent's result.

The registers are plain arrays here; every branch below corresponds line for line to
the P4 control, and the packet suite runs the same expectations against both.
"""

from __future__ import annotations

import numpy as np

from homagg.refswitch.device import Device
from homagg.refswitch.packet import (
    AggH,
    Ethernet,
    Headers,
    Ipv4,
    Metadata,
    StandardMetadata,
    Udp,
)
from homagg.wire import p4names
from homagg.wire.combine import combine_cells
from homagg.wire.constants import (
    AGG_IPV4_LENGTH,
    AGG_UDP_LENGTH,
    AGG_UDP_PORT,
    AGG_VERSION,
    CELLS_PER_PKT,
    CHUNK_BITS,
    CHUNK_MASK,
    NUM_SLOT_COPIES,
    NUM_SLOTS,
    RESULT_TTL,
    SHADOW_BITS,
    SHADOW_COPIES,
    SLOT_COUNT_MASK,
    SLOT_FINAL,
    DropReason,
    Event,
    Flag,
    Op,
)

VERDICT_FRESH = 1  # first of a newer round (or another job): overwrite
VERDICT_COMBINE = 2  # same round, new worker: combine with op
VERDICT_RESEND = 3  # same round, worker seen, round complete: result back to sender
VERDICT_DUPLICATE = 4  # same round, worker seen, round open: drop
VERDICT_STALE = 5  # an older round of the same job: drop
VERDICT_RESEND_UP = 6  # same round, worker seen, complete at this leaf, no parent result yet


class AggregationRegisters:
    """slot_state (split into its packed fields) and the cell groups, per slot copy."""

    def __init__(self) -> None:
        self.job = [0] * NUM_SLOT_COPIES
        self.chunk = [0] * NUM_SLOT_COPIES
        self.seen = [0] * NUM_SLOT_COPIES
        self.count = [0] * NUM_SLOT_COPIES
        self.exp = [0] * NUM_SLOT_COPIES
        self.cells = np.zeros((NUM_SLOT_COPIES, CELLS_PER_PKT), np.int32)


def update_slot(regs: AggregationRegisters, agg: AggH, meta: Metadata) -> None:
    """The update_slot action: one read-modify-write of the slot copy's state; writes the
    slot's exponent into the (valid) aggregation header `agg`."""
    i = meta.slot_index
    st_job, st_chunk, seen = regs.job[i], regs.chunk[i], regs.seen[i]
    count, exp = regs.count[i], regs.exp[i]
    age = (agg.chunk - st_chunk) & CHUNK_MASK  # serial-number arithmetic (RFC 1982)
    other_job = st_job != agg.job_id
    older = age >> (CHUNK_BITS - 1) == 1  # the difference's sign bit
    fresh = other_job or (age != 0 and not older)
    combine = not fresh and not older and (seen & meta.worker_bit) == 0
    complete = count & SLOT_COUNT_MASK == meta.num_workers
    # At a leaf, complete but without the parent's result: the partial goes up again.
    up = meta.has_uplink == 1 and not count & SLOT_FINAL
    if fresh:
        meta.verdict = VERDICT_FRESH
    elif older:
        meta.verdict = VERDICT_STALE
    elif combine:
        meta.verdict = VERDICT_COMBINE
    else:
        resend = VERDICT_RESEND_UP if up else VERDICT_RESEND
        meta.verdict = resend if complete else VERDICT_DUPLICATE
    if fresh:
        regs.job[i], regs.chunk[i], regs.seen[i] = agg.job_id, agg.chunk, meta.worker_bit
        regs.count[i], regs.exp[i] = 1, agg.exp
    elif combine:
        regs.seen[i] = seen | meta.worker_bit
        regs.count[i] = (count + 1) & 0xFF
        regs.exp[i] = max(exp, agg.exp)
    meta.count = regs.count[i]
    agg.exp = regs.exp[i]


def accept_result(regs: AggregationRegisters, agg: AggH, meta: Metadata) -> None:
    """The accept_result action: a parent's result is taken (the copy becomes final and
    keeps the result's exponent; drop_reason NONE) when the copy holds this job's chunk
    complete and not final; DUPLICATE when it is final already, else STALE."""
    i = meta.slot_index
    count = regs.count[i]
    same = regs.job[i] == agg.job_id and regs.chunk[i] == agg.chunk
    final = count & SLOT_FINAL != 0
    if same and not final and count & SLOT_COUNT_MASK == meta.num_workers:
        regs.count[i], regs.exp[i] = count | SLOT_FINAL, agg.exp
        meta.drop_reason = DropReason.NONE
    else:
        meta.drop_reason = DropReason.DUPLICATE if same and final else DropReason.STALE


def to_parent(
    eth: Ethernet, ipv4: Ipv4, udp: Udp, agg: AggH, meta: Metadata, std: StandardMetadata
) -> None:
    """The to_parent action: the copy leaves as one contribution to the parent, from this
    leaf's service address (the contribution's destination) and its uplink rank."""
    agg.flags = 0
    agg.rank = meta.uplink_rank
    eth.src_addr, eth.dst_addr = eth.dst_addr, meta.parent_mac
    ipv4.src_addr, ipv4.dst_addr = ipv4.dst_addr, meta.parent_ip
    ipv4.ttl = RESULT_TTL
    udp.src_port = udp.dst_port = AGG_UDP_PORT
    udp.checksum = 0
    std.egress_spec = meta.uplink_port


def to_group(agg: AggH, meta: Metadata, std: StandardMetadata) -> None:
    """The to_group action: a result leaves to the job's group; to_delivery marks it as
    the aggregation's own, the only kind of packet the egress delivers."""
    agg.flags = Flag.RESULT
    std.mcast_grp = meta.mcast_grp
    meta.to_delivery = 1


def to_sender(agg: AggH, meta: Metadata, std: StandardMetadata) -> None:
    """The to_sender action: a resent result goes back to the worker that asked for it."""
    agg.flags = Flag.RESULT | Flag.RETX
    std.egress_spec = std.ingress_port
    meta.to_delivery = 1


def slot_in_pool(pool_base: int, pool_size: int, slot: int) -> bool:
    """Whether slot (relative to the pool) is in the job's pool and in the switch: the
    P4 check, which never computes pool_base + slot in 32 bits (it could wrap round into
    another job's slots); the entry's pool_base is not trusted to be below NUM_SLOTS."""
    return pool_base < NUM_SLOTS and slot < pool_size and slot < NUM_SLOTS - pool_base


def _combine_cells(
    regs: AggregationRegisters, op: int, cells: np.ndarray, meta: Metadata
) -> np.ndarray:
    """add_cells / add16_cells / add8_cells / or_cells / max_cells (homagg.wire.combine):
    written back; returns the packet's new cells."""
    combined = combine_cells(op, regs.cells[meta.slot_index], cells)
    regs.cells[meta.slot_index] = combined
    return combined


def _invalid(agg: AggH, udp: Udp, ipv4: Ipv4) -> DropReason | None:
    """The header checks of Aggregation.apply(), before any table: the reason to drop a
    contribution whose header, lengths or op the program cannot take, else None."""
    if agg.version != AGG_VERSION or agg.shadow >= SHADOW_COPIES:
        return DropReason.BAD_HEADER
    if (
        agg.ncells == 0
        or agg.ncells > CELLS_PER_PKT
        or udp.length != AGG_UDP_LENGTH
        or ipv4.total_len != AGG_IPV4_LENGTH
    ):
        return DropReason.BAD_LENGTH
    if agg.op < Op.ADD or agg.op > max(Op):
        return DropReason.BAD_OP
    return None


def _find_job(device: Device, agg: AggH, meta: Metadata, std: StandardMetadata) -> bool:
    """job_table applied (False: a miss), then uplink (meta.has_uplink: a leaf of the job)."""
    hit, _, params = device.table(p4names.JOB_TABLE).lookup((agg.job_id,), std.packet_length)
    if not hit:
        return False
    meta.pool_base, meta.pool_size = params["pool_base"], params["pool_size"]
    meta.num_workers, meta.mcast_grp = params["num_workers"], params["mcast_grp"]
    meta.has_uplink = 0
    hit, _, params = device.table(p4names.UPLINK).lookup((agg.job_id,), std.packet_length)
    if hit:
        meta.has_uplink, meta.uplink_port = 1, params["port"]
        meta.uplink_rank, meta.parent_ip = params["rank"], params["parent_ip"]
        meta.parent_mac = params["parent_mac"]
    return True


def _find_result_slot(agg: AggH, meta: Metadata, std: StandardMetadata) -> DropReason | None:
    """A result's checks: only a leaf of the job takes one, only from its parent's port and
    with its own uplink rank, for a slot of the pool; sets meta.slot_index."""
    if meta.has_uplink == 0:
        return DropReason.BAD_HEADER
    if std.ingress_port != meta.uplink_port:
        return DropReason.WRONG_PORT
    if agg.rank != meta.uplink_rank:
        return DropReason.BAD_RANK
    return _slot_index(agg, meta)


def _slot_index(agg: AggH, meta: Metadata) -> DropReason | None:
    """SLOT_OUT_OF_POOL, or None with meta.slot_index set."""
    if not slot_in_pool(meta.pool_base, meta.pool_size, agg.slot):
        return DropReason.SLOT_OUT_OF_POOL
    # Below NUM_SLOT_COPIES: the shift is times SHADOW_COPIES.
    meta.slot_index = ((meta.pool_base + agg.slot) << SHADOW_BITS) | agg.shadow
    return None


def _find_slot(
    device: Device, agg: AggH, meta: Metadata, std: StandardMetadata
) -> DropReason | None:
    """A contribution's checks: worker_table applied, the ingress port and the slot checked,
    and meta.slot_index set: the reason to drop, else None."""
    hit, _, params = device.table(p4names.WORKER_TABLE).lookup(
        (agg.job_id, agg.rank), std.packet_length
    )
    if not hit:
        return DropReason.BAD_RANK
    meta.worker_port, meta.worker_bit = params["port"], params["worker_bit"]
    if meta.worker_port != std.ingress_port:
        return DropReason.WRONG_PORT
    return _slot_index(agg, meta)


def _answer(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """After the cells: count the event, and send a completed round's result to the group
    (at a leaf: its partial to the parent), a resent one back to its sender (at a leaf
    without the parent's result yet: the partial up again), or drop a duplicate or stale
    contribution."""
    agg, eth, ipv4, udp = hdr.agg, hdr.ethernet, hdr.ipv4, hdr.udp
    assert agg is not None and eth is not None and ipv4 is not None and udp is not None
    events = device.counter(p4names.EVENT_COUNTER)
    if meta.verdict in (VERDICT_FRESH, VERDICT_COMBINE):
        events.count(Event.CONTRIBUTION, std.packet_length)
        if meta.count != meta.num_workers:
            meta.absorbed = 1
        elif meta.has_uplink == 1:
            to_parent(eth, ipv4, udp, agg, meta, std)
            events.count(Event.PARTIAL, std.packet_length)
        else:
            to_group(agg, meta, std)
            events.count(Event.RESULT, std.packet_length)
    elif meta.verdict == VERDICT_RESEND_UP:
        to_parent(eth, ipv4, udp, agg, meta, std)
        agg.flags = Flag.RETX
        events.count(Event.PARTIAL, std.packet_length)
    elif meta.verdict == VERDICT_RESEND:
        to_sender(agg, meta, std)
        events.count(Event.RESENT, std.packet_length)
    elif meta.verdict == VERDICT_DUPLICATE:
        meta.drop_reason = DropReason.DUPLICATE
    else:
        meta.drop_reason = DropReason.STALE


def aggregation(
    device: Device, regs: AggregationRegisters, hdr: Headers, meta: Metadata, std: StandardMetadata
) -> None:
    """Aggregation.apply()."""
    agg, cells, udp, ipv4 = hdr.agg, hdr.cells, hdr.udp, hdr.ipv4
    # The parser extracts agg and its cells only under a valid ipv4 and udp: the other
    # checks hold for every parsed packet and only name that invariant.
    if agg is None or cells is None or udp is None or ipv4 is None:
        meta.drop_reason = DropReason.BAD_HEADER
        return
    reason = _invalid(agg, udp, ipv4)
    if reason is None and not _find_job(device, agg, meta, std):
        reason = DropReason.UNKNOWN_JOB
    if reason is None:
        if agg.flags & Flag.RESULT:
            reason = _find_result_slot(agg, meta, std)
        else:
            reason = _find_slot(device, agg, meta, std)
    if reason is not None:
        meta.drop_reason = reason
        return
    if agg.flags & Flag.RESULT:
        _take_result(device, regs, hdr, meta, std)
        return
    update_slot(regs, agg, meta)
    if meta.verdict == VERDICT_FRESH:
        regs.cells[meta.slot_index] = cells
    elif meta.verdict == VERDICT_COMBINE:
        hdr.cells = _combine_cells(regs, agg.op, cells, meta)
    elif meta.verdict in (VERDICT_RESEND, VERDICT_RESEND_UP):
        hdr.cells = regs.cells[meta.slot_index].copy()
    _answer(device, hdr, meta, std)


def _take_result(
    device: Device, regs: AggregationRegisters, hdr: Headers, meta: Metadata, std: StandardMetadata
) -> None:
    """A parent's result at a leaf: accepted ones are stored and go to the job's group."""
    agg = hdr.agg
    assert agg is not None and hdr.cells is not None
    accept_result(regs, agg, meta)
    if meta.drop_reason == DropReason.NONE:
        regs.cells[meta.slot_index] = hdr.cells
        to_group(agg, meta, std)
        device.counter(p4names.EVENT_COUNTER).count(Event.RESULT, std.packet_length)
