"""A burst on one port is not lost before the pipeline: BURST frames sent back to back from
one host are each answered or counted, on both targets.

The cause it guards against (docs/bmv2.md): with a veth's segmentation offloads on,
libpcap gave BMv2 a capture ring of ~31 frames per port, so such a burst lost all but ~32
frames in the kernel, where no P4 counter sees them; the fabric's switch ports have them off
(homagg/lab/switch_process.py:prepare_ports). With prepare_ports made a no-op, BMv2 failed
both tests here (32 of 256 contributions counted; 16 + 16 of the mixed burst). Each test
waits for the counters to account for every frame, so a loss shows as a shortfall."""

from __future__ import annotations

import time

import numpy as np
import pytest

from homagg.lab.aggjob import CounterDelta, Job, agg_frame, random_cells
from homagg.lab.fabric import Fabric
from homagg.wire.constants import DropReason, Event

BURST = 256  # 8x the ~31 frames a port's capture ring held with offloads on
PATIENCE = 30.0  # seconds for BMv2 (a few thousand frames/s) to work through a burst


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 2, tmp_path_factory.mktemp(target)) as f:
        yield f


def counted(counters: CounterDelta, event: Event, drop: DropReason | None, total: int) -> tuple:
    """(events, drops) once they add up to `total` frames, or what they are at PATIENCE."""
    deadline = time.monotonic() + PATIENCE
    while True:
        events, drops = counters.events(), counters.drops()
        n = events.get(event, 0) + (drops.get(drop, 0) if drop is not None else 0)
        if n >= total or time.monotonic() > deadline:
            return events, drops
        time.sleep(0.1)


def test_a_burst_of_contributions_is_answered_in_full(fabric):
    """A one-rank job: every contribution completes its round, so every frame of the burst
    comes back as a result with its own chunk and cells."""
    job = Job(fabric, fabric.hosts[:1], pool_size=BURST)
    rng = np.random.default_rng(11)
    cells = [random_cells(rng) for _ in range(BURST)]
    frames = [job.frame(0, cells[k], slot=k, chunk=k) for k in range(BURST)]  # built first
    fabric.drain()
    counters = CounterDelta(fabric)
    port = job.hosts[0].raw
    for frame in frames:  # back to back
        port.send(frame)
    got = [agg_frame(f) for f in port.receive(PATIENCE, count=BURST)]  # not Scapy: faster
    events, drops = counted(counters, Event.RESULT, None, BURST)
    assert (events.get(Event.CONTRIBUTION, 0), events.get(Event.RESULT, 0)) == (BURST, BURST)
    assert drops == {}
    results = {p[0].chunk: p[1] for p in got if p is not None}
    assert sorted(results) == list(range(BURST)), f"{BURST - len(results)} results missing"
    for k in range(BURST):
        np.testing.assert_array_equal(results[k], cells[k])


def test_a_mixed_burst_is_answered_or_counted(fabric):
    """Contributions interleaved with frames of a job the switch does not have: every one
    is either answered (a result) or dropped and counted (UNKNOWN_JOB)."""
    job = Job(fabric, fabric.hosts[:1], pool_size=BURST // 2)
    rng = np.random.default_rng(12)
    frames = [
        job.frame(0, random_cells(rng), slot=k // 2, chunk=k // 2)
        if k % 2 == 0
        else job.frame(0, random_cells(rng), job_id=60000 + k % 7)
        for k in range(BURST)
    ]
    fabric.drain()
    counters = CounterDelta(fabric)
    port = job.hosts[0].raw
    for frame in frames:
        port.send(frame)
    got = [agg_frame(f) for f in port.receive(PATIENCE, count=BURST // 2)]
    events, drops = counted(counters, Event.CONTRIBUTION, DropReason.UNKNOWN_JOB, BURST)
    answered = sum(1 for p in got if p is not None)
    assert (answered, drops.get(DropReason.UNKNOWN_JOB, 0)) == (BURST // 2, BURST // 2)
    assert events.get(Event.CONTRIBUTION, 0) == BURST // 2 and set(drops) == {
        DropReason.UNKNOWN_JOB
    }
