"""Every malformed or unauthorized packet is dropped and counted under its reason."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from homagg.lab.aggjob import CounterDelta, Job, random_cells, result_cells, wrapped_sum
from homagg.lab.fabric import SERVICE_IP, Fabric
from homagg.wire.constants import DropReason, Flag, Op

QUIET = 0.3


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 4, tmp_path_factory.mktemp(target)) as f:
        yield f


@pytest.fixture(scope="module")
def job(fabric):
    return Job(fabric, fabric.hosts[:3], pool_size=8)


def from_service(frame: bytes) -> bytes:
    """The frame with the switch's service address as its IPv4 source (a forgery)."""
    pkt = Ether(frame)
    pkt[IP].src = SERVICE_IP
    del pkt[IP].chksum
    if pkt[UDP].chksum:
        del pkt[UDP].chksum
    return bytes(pkt)


CASES = {
    "unknown job": (DropReason.UNKNOWN_JOB, lambda job, c: job.frame(0, c, job_id=60000)),
    "slot outside the pool": (DropReason.SLOT_OUT_OF_POOL, lambda job, c: job.frame(0, c, slot=8)),
    "rank not in the job": (DropReason.BAD_RANK, lambda job, c: job.frame(0, c, rank=3)),
    "bad op": (DropReason.BAD_OP, lambda job, c: job.frame(0, c, op=9)),
    "op 0": (DropReason.BAD_OP, lambda job, c: job.frame(0, c, op=0)),
    "op after the last": (DropReason.BAD_OP, lambda job, c: job.frame(0, c, op=max(Op) + 1)),
    "zero cells": (DropReason.BAD_LENGTH, lambda job, c: job.frame(0, c, ncells=0)),
    "too many cells": (DropReason.BAD_LENGTH, lambda job, c: job.frame(0, c, ncells=1000)),
    "bad version": (DropReason.BAD_HEADER, lambda job, c: job.frame(0, c, version=7)),
    "shadow 2": (DropReason.BAD_HEADER, lambda job, c: job.frame(0, c, shadow=2)),
    "result flag from a worker": (
        DropReason.BAD_HEADER,
        lambda job, c: job.frame(0, c, flags=Flag.RESULT),
    ),
    # Before anything of aggregation, in the XDP stage too (which must not absorb it).
    "from the service address": (
        DropReason.WRONG_PORT,
        lambda job, c: from_service(job.frame(0, c)),
    ),
    "truncated cells": (DropReason.TRUNCATED, lambda job, c: job.frame(0, c)[:-9]),
    "truncated header": (DropReason.TRUNCATED, lambda job, c: job.frame(0, c)[: 14 + 20 + 8 + 6]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_packet_is_dropped_by_reason(fabric, job, case):
    reason, make = CASES[case]
    fabric.drain()
    counters = CounterDelta(fabric)
    job.hosts[0].raw.send(make(job, random_cells(np.random.default_rng(1))))
    assert all(not v for v in job.collect(timeout=QUIET).values())
    assert counters.drops() == {reason: 1}


def test_oversized_packet_is_dropped(fabric, job):
    """Extra bytes after the cells, with IPv4 and UDP lengths that admit them."""
    frame = Ether(job.frame(0, random_cells(np.random.default_rng(2)))) / Raw(b"\x00" * 40)
    del frame[IP].len, frame[IP].chksum, frame[UDP].len
    counters = CounterDelta(fabric)
    job.hosts[0].raw.send(bytes(frame))
    assert all(not v for v in job.collect(timeout=QUIET).values())
    assert counters.drops() == {DropReason.BAD_LENGTH: 1}


def test_rank_sending_from_another_port_is_dropped(fabric, job):
    counters = CounterDelta(fabric)
    job.send(0, random_cells(np.random.default_rng(3)), via=fabric.hosts[3])
    assert all(not v for v in job.collect(timeout=QUIET).values())
    assert counters.drops() == {DropReason.WRONG_PORT: 1}


def test_drops_do_not_disturb_a_round(fabric, job):
    """Garbage between the contributions of a round leaves its sum exact."""
    rng = np.random.default_rng(4)
    parts = [random_cells(rng) for _ in range(3)]
    job.send(0, parts[0], slot=2, chunk=77)
    for case in sorted(CASES):
        job.hosts[1].raw.send(CASES[case][1](job, random_cells(rng)))
    job.send(1, parts[1], slot=2, chunk=77)
    job.send(2, parts[2], slot=2, chunk=77)
    for _r, pkts in job.collect().items():
        np.testing.assert_array_equal(result_cells(pkts[0]), wrapped_sum(parts))
