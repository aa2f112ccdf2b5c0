"""Aggregation (p4src/aggregation.p4): validate a contribution, find the job's pool and
the worker's bit, classify it against its slot copy and combine the cells.

The registers are plain arrays here; every branch below corresponds line for line to
the P4 control, and the packet suite runs the same expectations against both.
"""

from __future__ import annotations

import numpy as np

from homagg.refswitch.device import Device
from homagg.refswitch.packet import AggH, Headers, Ipv4, Metadata, StandardMetadata, Udp
from homagg.wire import p4names
from homagg.wire.combine import combine_cells
from homagg.wire.constants import (
    AGG_IPV4_LENGTH,
    AGG_UDP_LENGTH,
    AGG_VERSION,
    CELLS_PER_PKT,
    CHUNK_BITS,
    CHUNK_MASK,
    NUM_SLOT_COPIES,
    NUM_SLOTS,
    SHADOW_BITS,
    SHADOW_COPIES,
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
    if fresh:
        meta.verdict = VERDICT_FRESH
    elif older:
        meta.verdict = VERDICT_STALE
    elif combine:
        meta.verdict = VERDICT_COMBINE
    else:
        meta.verdict = VERDICT_RESEND if count == meta.num_workers else VERDICT_DUPLICATE
    if fresh:
        regs.job[i], regs.chunk[i], regs.seen[i] = agg.job_id, agg.chunk, meta.worker_bit
        regs.count[i], regs.exp[i] = 1, agg.exp
    elif combine:
        regs.seen[i] = seen | meta.worker_bit
        regs.count[i] = (count + 1) & 0xFF
        regs.exp[i] = max(exp, agg.exp)
    meta.count = regs.count[i]
    agg.exp = regs.exp[i]


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
    if agg.version != AGG_VERSION or agg.shadow >= SHADOW_COPIES or agg.flags & Flag.RESULT:
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


def _find_slot(
    device: Device, agg: AggH, meta: Metadata, std: StandardMetadata
) -> DropReason | None:
    """job_table and worker_table applied, the ingress port and the slot checked, and
    meta.slot_index set: the reason to drop, else None."""
    hit, _, params = device.table(p4names.JOB_TABLE).lookup((agg.job_id,), std.packet_length)
    if not hit:
        return DropReason.UNKNOWN_JOB
    meta.pool_base, meta.pool_size = params["pool_base"], params["pool_size"]
    meta.num_workers, meta.mcast_grp = params["num_workers"], params["mcast_grp"]
    hit, _, params = device.table(p4names.WORKER_TABLE).lookup(
        (agg.job_id, agg.rank), std.packet_length
    )
    if not hit:
        return DropReason.BAD_RANK
    meta.worker_port, meta.worker_bit = params["port"], params["worker_bit"]
    if meta.worker_port != std.ingress_port:
        return DropReason.WRONG_PORT
    if not slot_in_pool(meta.pool_base, meta.pool_size, agg.slot):
        return DropReason.SLOT_OUT_OF_POOL
    # Below NUM_SLOT_COPIES: the shift is times SHADOW_COPIES.
    meta.slot_index = ((meta.pool_base + agg.slot) << SHADOW_BITS) | agg.shadow
    return None


def _answer(device: Device, agg: AggH, meta: Metadata, std: StandardMetadata) -> None:
    """After the cells: count the event, and send a completed round's result to the group,
    a resent one back to its sender, or drop a duplicate or stale contribution."""
    events = device.counter(p4names.EVENT_COUNTER)
    if meta.verdict in (VERDICT_FRESH, VERDICT_COMBINE):
        events.count(Event.CONTRIBUTION, std.packet_length)
        if meta.count == meta.num_workers:
            agg.flags = Flag.RESULT
            std.mcast_grp = meta.mcast_grp
            events.count(Event.RESULT, std.packet_length)
        else:
            meta.absorbed = 1
    elif meta.verdict == VERDICT_RESEND:
        agg.flags = Flag.RESULT | Flag.RETX
        std.egress_spec = std.ingress_port
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
    if reason is None:
        reason = _find_slot(device, agg, meta, std)
    if reason is not None:
        meta.drop_reason = reason
        return
    update_slot(regs, agg, meta)
    if meta.verdict == VERDICT_FRESH:
        regs.cells[meta.slot_index] = cells
    elif meta.verdict == VERDICT_COMBINE:
        hdr.cells = _combine_cells(regs, agg.op, cells, meta)
    elif meta.verdict == VERDICT_RESEND:
        hdr.cells = regs.cells[meta.slot_index].copy()
    _answer(device, agg, meta, std)
