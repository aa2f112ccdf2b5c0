"""A job entry whose pool lies at the 32-bit edge (no controller writes one, but the data
plane must not trust the control plane for isolation): its packets are dropped as
SLOT_OUT_OF_POOL, never wrapped round into another job's slots."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from homagg.lab.aggjob import CounterDelta, Job, random_cells, result_cells, wrapped_sum
from homagg.lab.fabric import Fabric
from homagg.lab.poll import wait_for
from homagg.wire import p4names
from homagg.wire.constants import MAX_JOB_ID, NUM_SLOTS, DropReason, Event
from homagg.wire.scapy_layer import Agg

U32 = 2**32 - 1
VICTIM_SLOTS = 8
CHUNK = 5
# Job ids far above the testnet counter's, one per case.
_rogue_ids = iter(range(MAX_JOB_ID, MAX_JOB_ID - 100, -1))


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 2, tmp_path_factory.mktemp(target)) as f:
        yield f


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.fixture
def victim(fabric) -> Job:
    """An ordinary two-rank job with VICTIM_SLOTS slots, installed by the controller's code."""
    return Job(fabric, fabric.hosts[:2], pool_size=VICTIM_SLOTS)


@pytest.fixture
def rogue(fabric, victim) -> Iterator[Callable[[int, int], int]]:
    """install(pool_base, pool_size) -> job id: a job entry written directly over P4Runtime,
    whose rank 0 sends from the victim's rank 0 host; removed after the test."""
    installed = []

    def install(pool_base: int, pool_size: int) -> int:
        job_id = next(_rogue_ids)
        key = {"hdr.agg.job_id": job_id, "hdr.agg.rank": 0}
        fabric.conn.insert_entry(
            p4names.WORKER_TABLE,
            key,
            p4names.SET_WORKER,
            {"port": victim.hosts[0].switch_port, "worker_bit": 1},
        )
        # Two workers: a rogue contribution alone never completes a round.
        fabric.conn.insert_entry(
            p4names.JOB_TABLE,
            {"hdr.agg.job_id": job_id},
            p4names.SET_JOB,
            {"pool_base": pool_base, "pool_size": pool_size, "num_workers": 2, "mcast_grp": job_id},
        )
        installed.append(job_id)
        return job_id

    yield install
    for job_id in installed:
        fabric.conn.delete_entry(p4names.JOB_TABLE, {"hdr.agg.job_id": job_id})
        fabric.conn.delete_entry(
            p4names.WORKER_TABLE, {"hdr.agg.job_id": job_id, "hdr.agg.rank": 0}
        )


def accounted(counters: CounterDelta) -> int:
    """Packets the switch has dropped or taken as contributions since counters was made."""
    return sum(counters.drops().values()) + counters.events().get(Event.CONTRIBUTION, 0)


CASES = {
    # name: (pool_base, pool_size, slots sent), given the victim's pool base
    "base 2^32-1, size 4": lambda p: (U32, 4, [0, 1, 2, 3]),
    "base 2^32-2, size 4": lambda p: (U32 - 1, 4, [0, 1, 2, 3]),
    "base 2^32-2, slots wrapping onto the victim's": lambda p: (
        U32 - 1,
        p + 2 + VICTIM_SLOTS,
        list(range(p + 2, p + 2 + VICTIM_SLOTS)),
    ),
    "base 2^32-4096, slots wrapping onto the victim's": lambda p: (
        2**32 - NUM_SLOTS,
        NUM_SLOTS + p + VICTIM_SLOTS,
        list(range(NUM_SLOTS + p, NUM_SLOTS + p + VICTIM_SLOTS)),
    ),
    "base NUM_SLOTS": lambda p: (NUM_SLOTS, 4, [0, 1, 2, 3]),
    "pool past the switch's last slot": lambda p: (NUM_SLOTS - 2, 4, [2, 3]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_edge_pool_is_dropped_and_other_jobs_untouched(fabric, victim, rogue, rng, case):
    pool_base, pool_size, slots = CASES[case](victim.entries.pool_base)
    rogue_id = rogue(pool_base, pool_size)
    fabric.drain()
    counters = CounterDelta(fabric)
    parts = [[random_cells(rng) for _ in range(VICTIM_SLOTS)] for _ in range(2)]
    for s in range(VICTIM_SLOTS):  # the victim's rounds open in every slot
        victim.send(0, parts[0][s], slot=s, chunk=CHUNK)
    for s in slots:  # same port as the victim's rank 0, so they follow its packets
        victim.send(0, random_cells(rng), job_id=rogue_id, slot=s, chunk=CHUNK + 1)
    wait_for(
        lambda: accounted(counters) >= VICTIM_SLOTS + len(slots),
        5.0,
        "the switch to count every packet sent so far",
    )
    assert counters.drops() == {DropReason.SLOT_OUT_OF_POOL: len(slots)}, (
        f"not all dropped as SLOT_OUT_OF_POOL; events {counters.events()}"
    )
    for s in range(VICTIM_SLOTS):
        victim.send(1, parts[1][s], slot=s, chunk=CHUNK)
    got = victim.collect(per_rank=VICTIM_SLOTS)
    for r, pkts in got.items():
        assert sorted(p[Agg].slot for p in pkts) == list(range(VICTIM_SLOTS)), f"rank {r}"
        for pkt in pkts:
            s = pkt[Agg].slot
            np.testing.assert_array_equal(
                result_cells(pkt), wrapped_sum([parts[0][s], parts[1][s]])
            )
    assert counters.events() == {Event.CONTRIBUTION: 2 * VICTIM_SLOTS, Event.RESULT: VICTIM_SLOTS}
    assert counters.drops() == {DropReason.SLOT_OUT_OF_POOL: len(slots)}


def test_slots_of_a_pool_at_the_switchs_end_that_fit_are_used(fabric, victim, rogue, rng):
    """The other side of the edge: pool_base + slot up to NUM_SLOTS - 1 aggregates."""
    rogue_id = rogue(NUM_SLOTS - 2, 4)
    counters = CounterDelta(fabric)
    for s in (0, 1):
        victim.send(0, random_cells(rng), job_id=rogue_id, slot=s, chunk=CHUNK)
    wait_for(lambda: accounted(counters) >= 2, 5.0, "the switch to count both packets")
    assert counters.drops() == {} and counters.events() == {Event.CONTRIBUTION: 2}
