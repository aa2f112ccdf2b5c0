"""The projection's arithmetic (bench/projection_model.py): closed forms of the alpha-beta
model and of the switch's packets, its edges, and the CLI's refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench import projection
from bench.projection_model import (
    Cluster,
    Costs,
    ModelError,
    best_switch_step,
    busiest_switch_absorbs,
    frame_bytes,
    halving_doubling_step,
    peer_wire_bytes,
    phase_cells,
    project,
    ring_step,
    switch_absorbs,
    switch_levels,
    switch_step,
)
from homagg.wire.constants import CELLS_PER_PKT

N = 1 << 20
GBPS_8 = 8.0  # 1e9 bytes/s: seconds = bytes / 1e9


def test_ring_is_2_w_minus_1_steps_of_n_over_w() -> None:
    costs = Costs(alpha_s=1e-5)
    got = ring_step(Cluster(workers=4, link_gbps=GBPS_8, elements=N), costs)
    payload = 2 * 3 / 4 * 4 * N
    assert got.seconds == pytest.approx(6 * 1e-5 + peer_wire_bytes(payload) / 1e9)
    assert got.bytes_per_worker == pytest.approx(peer_wire_bytes(payload))


def test_halving_doubling_is_2_log2_w_steps() -> None:
    costs = Costs(alpha_s=1e-3)  # latency-bound: a tiny gradient
    for w, steps in ((2, 2), (8, 6), (9, 8), (256, 16)):
        got = halving_doubling_step(Cluster(workers=w, link_gbps=100, elements=1), costs)
        assert got.seconds == pytest.approx(steps * 1e-3, rel=1e-3)
        assert got.limit == "latency"


def test_switch_dense_is_packets_at_the_link_plus_a_round_trip_a_phase() -> None:
    costs = Costs(rtt_s=1e-5)
    got = switch_step(Cluster(workers=8, link_gbps=GBPS_8, elements=N), costs, "fixed_point")
    packets = math.ceil(math.ceil(N / 16384) / CELLS_PER_PKT) + math.ceil((N + 1) / CELLS_PER_PKT)
    packets += 1  # the hook's verdict: a third phase of one packet
    assert got.seconds == pytest.approx(packets * frame_bytes(CELLS_PER_PKT) / 1e9 + 3 * 1e-5)
    assert got.limit == "link"


def test_switch_bytes_stay_flat_while_the_ring_grows() -> None:
    costs = Costs()
    switch = [
        switch_step(Cluster(workers=w, link_gbps=100, elements=N), costs, "fixed_point")
        for w in (2, 8, 32)
    ]
    ring = [ring_step(Cluster(workers=w, link_gbps=100, elements=N), costs) for w in (2, 8, 32)]
    assert len({s.bytes_per_worker for s in switch}) == 1
    assert [r.bytes_per_worker / ring[0].bytes_per_worker for r in ring] == pytest.approx(
        [1.0, 1.75, 31 / 16]
    )


def test_one_worker_has_nothing_to_reduce() -> None:
    got = project(Cluster(workers=1, link_gbps=100, elements=N), Costs())
    assert got["ring"].seconds == 0.0 and got["halving_doubling"].seconds == 0.0
    assert got["switch"].seconds > 0  # a worker alone still sends through the switch


def test_density_zero_sends_only_the_first_lossless_phase() -> None:
    assert len(phase_cells("lossless", N, 0.0, 4, verdict=False)) == 1
    assert phase_cells("lossless", N, 0.0, 4)[-1] == 1  # and the hook's verdict packet
    cluster = Cluster(workers=4, link_gbps=100, elements=N, density=0.0)
    assert best_switch_step(cluster, Costs()).method == "switch, lossless"


def test_density_one_picks_dense_fixed_point() -> None:
    lossless = phase_cells("lossless", N, 1.0, 4)
    assert sum(lossless) > sum(phase_cells("fixed_point", N, 1.0, 4))
    cluster = Cluster(workers=4, link_gbps=100, elements=N, density=1.0)
    assert best_switch_step(cluster, Costs()).method == "switch, fixed_point"


def test_lossless_cells_match_the_codec() -> None:
    from homagg.worker.codecs import LosslessSparse
    from homagg.worker.codecs.simulate import combine

    n, w, d = 100_000, 4, 0.01
    rng = np.random.default_rng(3)
    xs = []
    for _ in range(w):
        x = np.zeros(n, np.float32)
        x[rng.choice(n, int(n * d), replace=False)] = 1.0
        xs.append(x)
    gens = [LosslessSparse(w).aggregate(x) for x in xs]
    sent, cells = [next(g) for g in gens], []
    while True:
        cells.append(sent[0].cells.size)
        result = combine(sent[0].op, [p.cells for p in sent])
        try:
            sent = [g.send(result) for g in gens]
        except StopIteration:
            break
    model = phase_cells("lossless", n, d, w, verdict=False)
    assert len(model) == len(cells)
    assert np.asarray(model) == pytest.approx(np.asarray(cells), rel=0.03)


def test_window_and_switch_rate_bound_the_switch() -> None:
    cluster = Cluster(workers=4, link_gbps=100, elements=N, pool_size=1)
    assert switch_step(cluster, Costs(rtt_s=1e-3), "fixed_point").limit == "window"
    slow = Cluster(workers=4, link_gbps=100, elements=N, switch_pps=1000)
    got = switch_step(slow, Costs(), "fixed_point")
    assert got.limit == "switch"
    assert got.seconds == pytest.approx(4098 * 4 / 1000, rel=1e-3)


def test_tree_adds_one_round_trip_per_level() -> None:
    costs = Costs(rtt_s=1e-4)
    flat = switch_step(Cluster(workers=32, link_gbps=100, elements=N), costs, "fixed_point")
    tree = switch_step(Cluster(workers=33, link_gbps=100, elements=N), costs, "fixed_point")
    assert tree.seconds - flat.seconds == pytest.approx(3 * 1e-4)  # two phases and the verdict
    with pytest.raises(ModelError, match="switch level"):
        Cluster(workers=33, link_gbps=100, elements=N, depth=1)


def test_shared_cores_make_cpu_the_bound() -> None:
    costs = Costs(worker_packet_s=1e-5, worker_cpu_s=1e-5, switch_cpu_s=1e-5)
    got = switch_step(Cluster(workers=4, link_gbps=100, elements=N, cores=2), costs, "fixed_point")
    assert got.limit == "cpu"
    assert got.cpu_seconds == pytest.approx(4 * 4099 * 2e-5)  # 4,098 packets and the verdict


@pytest.mark.parametrize("link", [0.0, -1.0, math.nan])
def test_zero_link_rate_is_refused(link: float) -> None:
    with pytest.raises(ModelError, match="link rate must be > 0"):
        Cluster(workers=4, link_gbps=link, elements=N)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ModelError, match="workers"):
        Cluster(workers=0, link_gbps=100, elements=N)
    with pytest.raises(ModelError, match="density"):
        Cluster(workers=2, link_gbps=100, elements=N, density=1.5)
    with pytest.raises(ModelError, match="worker_packet_s"):
        Costs(worker_packet_s=-1.0)
    with pytest.raises(ModelError, match="unknown codec"):
        phase_cells("topk", N, 0.1, 2)


def test_cli_json_and_its_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    assert projection.main(["--json", "--no-plot", "--workers", "8", "--link-gbps", "100"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["workers"] for r in rows] == [8] * 4  # densities 1, 0.1, 0.01, 0.001
    assert rows[0]["speedup"] == pytest.approx(1.72, abs=0.02)  # 2(W-1)/W, frame overheads
    assert projection.main(["--json", "--no-plot", "--link-gbps", "0"]) == 2
    assert "link rate must be > 0" in capsys.readouterr().err


def test_a_tree_spreads_the_switch_rate_over_its_leaves() -> None:
    costs = Costs()
    one = switch_step(
        Cluster(workers=32, link_gbps=100, elements=N, switch_pps=1000), costs, "fixed_point"
    )
    tree = switch_step(
        Cluster(workers=64, link_gbps=100, elements=N, switch_pps=1000), costs, "fixed_point"
    )
    # a leaf holds 32 workers either way, and takes the parent's result back in: 33 a slot
    assert tree.limit == one.limit == "switch"
    assert tree.seconds == pytest.approx(one.seconds * 33 / 32)


@pytest.mark.parametrize(
    ("workers", "per_leaf", "depth", "levels", "busiest", "total"),
    [
        (8, 32, 0, [(1, 8, True)], 8, 8),  # one switch: its W contributions
        (8, 4, 2, [(2, 4, False), (1, 2, True)], 5, 12),  # make run's 2 x 4
        (8, 32, 2, [(1, 8, False), (1, 1, True)], 9, 10),  # a tree of one leaf
        (32, 1, 2, [(32, 1, False), (1, 32, True)], 32, 96),  # the spine is the busiest
        (64, 32, 0, [(2, 32, False), (1, 2, True)], 33, 68),
        # three levels: 64 leaves, 2 switches of 32 leaves each above them, the top
        (2048, 32, 0, [(64, 32, False), (2, 32, False), (1, 2, True)], 33, 2048 + 2 * 66),
        (256, 4, 0, [(64, 4, False), (2, 32, False), (1, 2, True)], 33, 256 + 2 * 66),
    ],
)
def test_each_switch_of_a_tree_absorbs_its_members_and_the_result_from_above(
    workers: int,
    per_leaf: int,
    depth: int,
    levels: list[tuple[int, int, bool]],
    busiest: int,
    total: int,
) -> None:
    c = Cluster(workers=workers, link_gbps=100, elements=N, depth=depth, workers_per_leaf=per_leaf)
    assert [(x.switches, x.members, x.top) for x in switch_levels(c)] == levels
    assert c.levels == len(levels) and c.switch_processes == sum(x[0] for x in levels)
    assert (busiest_switch_absorbs(c), switch_absorbs(c)) == (busiest, total)


@pytest.mark.parametrize(("workers", "per_leaf", "depth"), [(8, 4, 2), (32, 1, 2), (64, 32, 0)])
def test_a_trees_packet_rate_and_cpu_bounds_count_the_same_switch(
    workers: int, per_leaf: int, depth: int
) -> None:
    """A switch whose packet rate is one core's CPU a packet (the reference switch) bounds
    the step alike whether the model reads its rate or its process's CPU."""
    tree = {"workers": workers, "link_gbps": 1000, "elements": N, "depth": depth}
    tree["workers_per_leaf"] = per_leaf
    by_rate = switch_step(Cluster(**tree, switch_pps=1e4), Costs(), "fixed_point")
    shared = Cluster(**tree, cores=1000.0, rank_processes=True)
    by_cpu = switch_step(shared, Costs(switch_cpu_s=1e-4), "fixed_point")
    assert (by_rate.limit, by_cpu.limit) == ("switch", "switch process")
    assert by_rate.seconds == pytest.approx(by_cpu.seconds)
    busiest = busiest_switch_absorbs(shared)
    assert by_rate.seconds == pytest.approx(busiest * 4099 * 1e-4 + 3 * 2 * 10e-6)


def test_a_top_switch_beyond_32_members_is_refused() -> None:
    with pytest.raises(ModelError, match="top one would hold 64 members"):
        Cluster(workers=256, link_gbps=100, elements=N, depth=2, workers_per_leaf=4)
