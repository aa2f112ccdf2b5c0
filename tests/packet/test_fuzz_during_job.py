"""10,000 malformed packets at the aggregation port while a job runs: the switch keeps
serving, every one is dropped and counted under a reason, and the job's sums stay exact."""

from __future__ import annotations

import time

import numpy as np
import pytest

from homagg.lab.aggjob import CounterDelta, Job, random_cells, result_cells, wrapped_sum
from homagg.lab.fabric import Fabric
from homagg.wire.constants import AGG_FRAME_BYTES, CELLS_PER_PKT, DropReason, Flag, Op
from homagg.wire.frame import ipv4_checksum
from homagg.wire.header import HEADER_DTYPE
from homagg.wire.packer import pack_payloads

ROUNDS = 50
PER_ROUND = 200  # malformed frames between two rounds: 10,000 in all
# Paced: a batch waits until the counters account for the last one, so a count that falls
# short names the batch (bursts of 256 are lossless since the switch ports' offloads are off:
# tests/packet/test_bursts.py).
BATCH = 25
POLL_S = 0.005
INVALID = [  # (header field, bogus value) making a frame from rank 0's own port invalid
    ("op", 0),
    ("op", max(Op) + 1),
    ("op", 255),
    ("ncells", 0),
    ("ncells", CELLS_PER_PKT + 1),
    ("version", 2),
    ("shadow", 2),
    ("flags", Flag.RESULT),
    ("rank", 7),
    ("rank", 1),
    ("job_id", 999),
]


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 4, tmp_path_factory.mktemp(target)) as f:
        yield f


def malformed(job: Job, rng: np.random.Generator, n: int) -> list[tuple[int, bytes]]:
    """n invalid frames as (sending host index, frame): random headers from the intruder's
    port, single bogus fields from rank 0's port, truncated and oversized frames."""
    headers = np.zeros(n, HEADER_DTYPE)
    for name in HEADER_DTYPE.names:
        headers[name] = rng.integers(0, 1 << (8 * HEADER_DTYPE[name].itemsize), n, dtype=np.uint64)
    cells = rng.integers(-(1 << 31), 1 << 31, (n, CELLS_PER_PKT), dtype=np.int64).astype(np.int32)
    out = []
    for i, payload in enumerate(pack_payloads(headers, cells)):
        kind = i % 4
        if kind == 0:  # fuzzed header from a host that is not in the job
            out.append((3, job.templates[0].frame(payload.tobytes())))
        elif kind == 1:  # one bogus field from rank 0's port, the rest valid
            field, value = INVALID[int(rng.integers(len(INVALID)))]
            bad = job.frame(
                0,
                cells[i],
                slot=int(rng.integers(4)),
                chunk=int(rng.integers(1 << 20)),
                **{field: value},
            )
            out.append((0, bad))
        elif kind == 2:  # truncated inside the aggregation header or the cells
            frame = job.frame(0, cells[i])
            out.append((0, frame[: int(rng.integers(43, AGG_FRAME_BYTES))]))
        else:  # oversized: more cells than the lengths allow, lengths adjusted
            frame = bytearray(job.frame(0, cells[i]) + bytes(int(rng.integers(4, 200))))
            frame[16:18] = (len(frame) - 14).to_bytes(2, "big")
            frame[38:40] = (len(frame) - 34).to_bytes(2, "big")
            frame[24:26] = b"\x00\x00"
            frame[24:26] = ipv4_checksum(bytes(frame[14:34])).to_bytes(2, "big")
            out.append((0, bytes(frame)))
    return out


def wait_for_drops(counters: CounterDelta, expected: int, timeout: float = 30.0) -> dict:
    """The drops once `expected` are counted (or at the timeout). Polled every few ms: a
    batch takes BMv2 tens of ms, and a read of its counters ~2 ms."""
    deadline = time.monotonic() + timeout
    while True:
        drops = counters.drops()
        if sum(drops.values()) >= expected or time.monotonic() > deadline:
            return drops
        time.sleep(POLL_S)


def test_malformed_flood_during_a_job(fabric):
    rng = np.random.default_rng(7)
    job = Job(fabric, fabric.hosts[:3], pool_size=8)
    counters = CounterDelta(fabric)
    sent = 0
    for k in range(ROUNDS):
        for _ in range(0, PER_ROUND, BATCH):
            for host, frame in malformed(job, rng, BATCH):
                fabric.hosts[host].raw.send(frame)
            sent += BATCH
            wait_for_drops(counters, sent)
        parts = [random_cells(rng) for _ in range(3)]
        for r in range(3):
            job.send(r, parts[r], slot=k % 8, shadow=(k // 8) % 2, chunk=k, op=Op.ADD)
        got = job.collect(per_rank=1)
        for r in range(3):
            assert len(got[r]) == 1, f"round {k}: rank {r} got {len(got[r])} results"
            np.testing.assert_array_equal(result_cells(got[r][0]), wrapped_sum(parts))
    drops = wait_for_drops(counters, sent)
    assert sum(drops.values()) == sent, drops
    assert set(drops) <= {
        DropReason.TRUNCATED,
        DropReason.BAD_HEADER,
        DropReason.BAD_LENGTH,
        DropReason.BAD_OP,
        DropReason.UNKNOWN_JOB,
        DropReason.BAD_RANK,
        DropReason.WRONG_PORT,
        DropReason.SLOT_OUT_OF_POOL,
    }, drops
    assert len(drops) >= 6, f"the fuzz should reach most reasons: {drops}"
