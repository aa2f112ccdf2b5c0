"""The eBPF target's XDP stage in front of both levels of a tree job (docs/ebpf.md,
"Two-level aggregation"): it absorbs the contributions that do not complete a copy, at a
leaf as at the parent, and leaves everything else to the TC program: the completing
contribution (a leaf's partial goes up from TC), a resend up or down, and every result
packet. The same counters and results as with the TC program alone (tests/packet/test_tree.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from homagg.environment import EBPF_XDP_ENV
from homagg.lab.aggjob import CounterDelta, random_cells, result_cells, wrapped_sum
from homagg.lab.poll import wait_for
from homagg.lab.switch_process import ebpf_problem
from homagg.lab.tree_fabric import TreeFabric
from homagg.lab.tree_job import TreeJob
from homagg.wire.constants import DropReason, Event, Flag
from homagg.wire.scapy_layer import Agg

QUIET = 0.3  # seconds to wait before concluding that nothing more arrives
pytestmark = pytest.mark.skipif(bool(ebpf_problem()), reason=f"eBPF target: {ebpf_problem()}")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv(EBPF_XDP_ENV, "native")
        with TreeFabric("ebpf", 2, 2, tmp_path_factory.mktemp("tree-xdp")) as t:
            yield t


@pytest.fixture
def parts(request) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    return [random_cells(rng) for _ in range(4)]


def deltas(tree: TreeFabric) -> list[CounterDelta]:
    """The parent's counters, then each leaf's."""
    return [CounterDelta(f) for f in tree.switches()]


def wait_event(delta: CounterDelta, event: Event, count: int) -> None:
    wait_for(lambda: delta.events().get(event, 0) >= count, 5.0, f"{count} x {event.name}")


def assert_results(job: TreeJob, ranks: list[int], parts: list[np.ndarray], flags: int) -> None:
    got = job.collect(ranks)
    for r in ranks:
        assert len(got[r]) == 1, f"rank {r} got {len(got[r])} results"
        assert got[r][0][Agg].flags == flags and got[r][0][Agg].rank == r
        np.testing.assert_array_equal(result_cells(got[r][0]), wrapped_sum(parts))


def test_the_stage_runs_natively_on_every_port_of_the_tree(tree):
    for fabric, ports in zip(tree.switches(), (2, 3, 3), strict=True):
        log = fabric.switch.log_path.read_text().splitlines()
        lines = [ln for ln in log if "XDP stage:" in ln]
        assert lines and lines[0].count(" native") == ports, lines


def test_only_a_copys_completing_contribution_passes_at_both_levels(tree, parts):
    """Leaf 0's partial, the first at the parent, is absorbed there: the raw socket on the
    parent's end of the link (served after XDP) never sees it; leaf 1's completes the
    parent's copy and reaches TC, so the socket sees it."""
    job = TreeJob(tree, (2, 2))
    tree.drain()
    counters = deltas(tree)
    job.send(0, parts[0], chunk=1)
    job.send(0, parts[0], chunk=1, flags=Flag.RETX)  # a duplicate in the open copy
    job.send(1, parts[1], chunk=1)
    wait_event(counters[0], Event.CONTRIBUTION, 1)
    job.send(2, parts[2], chunk=1)
    job.send(3, parts[3], chunk=1)
    assert_results(job, [0, 1, 2, 3], parts, Flag.RESULT)
    assert tree.leaves[0].tap.receive(QUIET) == [], "absorbed by the parent's XDP stage"
    assert len(tree.leaves[1].tap.receive(QUIET)) == 1
    assert [c.events() for c in counters] == [
        {Event.CONTRIBUTION: 2, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 1, Event.RESULT: 1},
        {Event.CONTRIBUTION: 2, Event.PARTIAL: 1, Event.RESULT: 1},
    ]
    assert [c.drops() for c in counters] == [{}, {DropReason.DUPLICATE: 1}, {}]


def test_resends_up_and_down_pass_to_tc(tree, parts):
    """The parent's result to leaf 0 is lost: a worker's retransmission goes up again
    (RESEND_UP), the parent resends its result, leaf 0 stores and multicasts it; the next
    retransmission is answered from the final copy (RESEND), nothing goes up."""
    job = TreeJob(tree, (2, 2))
    tree.drain()
    with tree.cut_down(0):
        for r in range(4):
            job.send(r, parts[r], slot=3, chunk=5)
        # Leaf 1's copy of the parent's result left after leaf 0's (lost) one: one replica
        # loop (docs/ebpf.md, Replication).
        assert_results(job, [2, 3], parts, Flag.RESULT)
        assert job.collect([0, 1], timeout=QUIET) == {0: [], 1: []}
    tree.drain()
    counters = deltas(tree)
    job.send(0, parts[0], slot=3, chunk=5, flags=Flag.RETX)
    assert_results(job, [0, 1], parts, Flag.RESULT)
    job.send(1, parts[1], slot=3, chunk=5, flags=Flag.RETX)
    assert_results(job, [1], parts, Flag.RESULT | Flag.RETX)
    assert [c.events() for c in counters] == [
        {Event.RESENT: 1},
        {Event.PARTIAL: 1, Event.RESULT: 1, Event.RESENT: 1},
        {},
    ]
    assert [c.drops() for c in counters] == [{}, {}, {}]
