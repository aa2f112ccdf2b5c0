"""Workers' transports on a two-level job (what bench/tree_scaling.py drives at W = 64):
RankTraffic.channel gives each rank a socket toward its own leaf, and a dense
fixed-point step through leaf, parent and leaf again decodes exactly the codec's sum."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench.aggregation import POOL_SIZE, SwitchGroup
from homagg.lab.namespace import have_privileges
from homagg.lab.tree_fabric import TreeFabric
from homagg.lab.tree_job import TreeJob
from homagg.wire.constants import CELLS_PER_PKT
from homagg.worker.codecs import FixedPoint
from homagg.worker.codecs.simulate import simulate

BOUND = 60.0  # seconds for the whole test, building the three switches included


@pytest.mark.skipif(not have_privileges(), reason="needs root (namespaces and veth links)")
def test_transports_on_a_tree_job_decode_the_codec_s_sum(tmp_path):
    start = time.monotonic()
    rng = np.random.default_rng(7)
    # two chunks a worker more than the pool: slots are reused, shadow copies alternate
    xs = [rng.standard_normal(CELLS_PER_PKT * (POOL_SIZE + 2)).astype(np.float32) for _ in "ab"]
    with TreeFabric("refswitch", 2, 1, tmp_path) as tree:
        job = TreeJob(tree, [1, 1], pool_size=POOL_SIZE)
        for leaf in tree.leaves:
            leaf.hosts[0].enable_ip_stack()
        group = SwitchGroup(None, 2, 0.05, job=job)
        try:
            assert [t.channel.service[0] for t in group.transports] == [
                leaf.fabric.service_ip for leaf in tree.leaves
            ]
            _, out, _ = group.step([FixedPoint(2), FixedPoint(2)], xs)
        finally:
            group.close()
    expected = simulate([FixedPoint(2), FixedPoint(2)], xs)[0]
    assert all(np.array_equal(o, expected) for o in out)
    assert time.monotonic() - start < BOUND
