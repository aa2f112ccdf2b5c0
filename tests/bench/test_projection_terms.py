"""The projection's terms for a shared machine (no root, no switch): a ready process's share
of a core, the ranks as processes of their own, a tree's leaves and what its switches
absorb, the worker threads' per-thread term, the forwarding cost of a frame by its size,
and the load sampled during a run summed up per phase."""

from __future__ import annotations

import json
import os
import struct

import pytest
from calibration_record import RECORD

from bench.calibration import (
    costs_of,
    merge_medians,
    switch_cpu_at,
    switch_pps_of,
    threaded_costs,
)
from bench.forwarding_cost import crossing_latency, forwarding_threads, frame_cost, udp_frame
from bench.projection_model import Cluster, Costs, ModelError, ring_step, switch_step
from bench.run_load import phase_load, share_of, switch_frames
from homagg.wire.frame import ipv4_checksum

N = 1 << 16  # 257 ADD packets and a MAX packet a worker


def test_a_share_of_a_core_slows_every_cpu_and_latency_term() -> None:
    costs = Costs(worker_packet_s=20e-6, switch_cpu_s=50e-6, rtt_s=100e-6, alpha_s=1e-3)
    idle = Cluster(workers=4, link_gbps=1000, elements=N, switch_pps=2e4, cores=2.0)
    busy = Cluster(workers=4, link_gbps=1000, elements=N, switch_pps=2e4, cores=2.0, share=0.25)
    assert switch_step(busy, costs, "fixed_point").seconds == pytest.approx(
        4 * switch_step(idle, costs, "fixed_point").seconds
    )
    # the link (1000 Gbit/s here) is no slower for the load: all but its bytes scale
    assert ring_step(busy, costs).seconds == pytest.approx(4 * ring_step(idle, costs).seconds, 1e-3)
    fast_link = Cluster(workers=4, link_gbps=0.001, elements=N, share=0.5)  # the link bounds
    assert switch_step(fast_link, Costs(), "fixed_point").limit == "link"
    for share in (0.0, 1.5):
        with pytest.raises(ModelError, match="share"):
            Cluster(workers=4, link_gbps=1, elements=N, share=share)


def test_ranks_as_processes_share_the_cores_threads_take_one() -> None:
    costs = Costs(worker_cpu_s=100e-6, switch_cpu_s=1e-6)
    packets = 259  # the codec's 258 and the hook's verdict
    threads = Cluster(workers=4, link_gbps=1000, elements=N, cores=2.0)
    ranks = Cluster(workers=4, link_gbps=1000, elements=N, cores=2.0, rank_processes=True)
    got_threads = switch_step(threads, costs, "fixed_point")
    got_ranks = switch_step(ranks, costs, "fixed_point")
    assert got_threads.limit == "worker process"  # one process: one core at most
    assert got_threads.seconds == pytest.approx(4 * packets * 100e-6 + 3 * 10e-6)
    assert got_ranks.limit == "cpu"  # four processes on two cores
    assert got_ranks.seconds == pytest.approx(4 * packets * 101e-6 / 2 + 3 * 10e-6)


def test_a_trees_switches_absorb_partials_and_results_too() -> None:
    tree = Cluster(workers=8, link_gbps=1000, elements=N, depth=2, workers_per_leaf=4)
    assert (tree.leaves, tree.switch_processes) == (2, 3)
    flat = Cluster(workers=8, link_gbps=1000, elements=N)
    assert (flat.leaves, flat.switch_processes) == (0, 1)
    costs = Costs(switch_cpu_s=10e-6)
    # 8 contributions, 2 partials at the top, 2 results back at the leaves, a slot
    assert switch_step(tree, costs, "fixed_point").cpu_seconds == pytest.approx(12 * 259 * 10e-6)
    shared = Cluster(
        workers=8,
        link_gbps=1000,
        elements=N,
        depth=2,
        workers_per_leaf=4,
        cores=8.0,
        rank_processes=True,
    )
    got = switch_step(shared, costs, "fixed_point")
    assert got.limit == "switch process"  # a leaf: its 4 workers and the top's result
    assert got.seconds == pytest.approx(5 * 259 * 10e-6 + 3 * 2 * 10e-6)
    with pytest.raises(ModelError, match="workers_per_leaf"):
        Cluster(workers=8, link_gbps=1, elements=N, workers_per_leaf=33)


def test_worker_threads_add_a_calibrated_term_each() -> None:
    one = threaded_costs(RECORD, "refswitch", 1)
    assert one.worker_cpu_s == one.worker_packet_s == 30e-6
    # 30 us alone, 36 with 4 threads: +2 us a thread more
    assert threaded_costs(RECORD, "refswitch", 16).worker_cpu_s == pytest.approx(60e-6)
    fewer = {**RECORD["targets"]["refswitch"], "worker_cpu_threads_s": 15e-6}
    record = {**RECORD, "targets": {"refswitch": fewer}}
    # cheaper with threads (a loaded W = 1 waits alone): never below the smaller one
    assert threaded_costs(record, "refswitch", 32).worker_cpu_s == pytest.approx(15e-6)


def test_wall_time_costs_are_taken_back_to_an_idle_machine() -> None:
    loaded = {**RECORD, "share": 0.25}
    assert costs_of(loaded, "refswitch").alpha_s == pytest.approx(50e-6 * 0.25)
    assert costs_of(loaded, "refswitch").rtt_s == pytest.approx(200e-6 * 0.25)
    # CPU per packet is what it is, loaded or not
    assert costs_of(loaded, "refswitch").worker_cpu_s == costs_of(RECORD, "refswitch").worker_cpu_s


def test_a_switch_whose_threads_share_its_work_gets_more_than_a_core() -> None:
    # the reference switch: its CPU a frame above its wall time a frame is none of that
    assert forwarding_threads(RECORD, "refswitch") == 1.0
    assert forwarding_threads(RECORD, "ebpf") == 1.0  # not calibrated
    bmv2 = {"forward_frame_s": 120e-6, "forward_wall_s": 80e-6, "forward_small_s": 100e-6}
    record = {**RECORD, "forwarding": {**RECORD["forwarding"], "bmv2": bmv2}}
    record["targets"] = {**RECORD["targets"], "bmv2": RECORD["targets"]["refswitch"]}
    assert forwarding_threads(record, "bmv2") == pytest.approx(1.5)
    # its packet rate and its process's CPU bound both spread over those 1.5 cores
    assert switch_pps_of(record, "bmv2") == pytest.approx(1.5 / 50e-6)
    assert costs_of(record, "bmv2").switch_threads == pytest.approx(1.5)
    one = Costs(worker_cpu_s=1e-6, switch_cpu_s=50e-6)
    many = Costs(worker_cpu_s=1e-6, switch_cpu_s=50e-6, switch_threads=1.5)
    c = Cluster(workers=4, link_gbps=1000, elements=N, cores=2.0)
    assert switch_step(c, one, "fixed_point").limit == "switch process"
    assert switch_step(c, many, "fixed_point").seconds < switch_step(c, one, "fixed_point").seconds
    with pytest.raises(ModelError, match="switch_threads"):
        Costs(switch_threads=0.5)
    # a frame's crossing of an idle switch: calibrated, or 0 (the eBPF program's is the
    # sender's own send)
    assert crossing_latency(RECORD, "refswitch") == 30e-6
    assert crossing_latency(RECORD, "ebpf") == 0.0


def test_a_switchs_cpu_a_contribution_follows_the_workers_at_it() -> None:
    t = {**RECORD["targets"]["refswitch"], "switch_process_threads_s": 80e-6}
    record = {**RECORD, "targets": {"refswitch": t}}
    # 50 us with one worker, 80 with 4: 10 us more a worker, held at the measured ends
    assert switch_cpu_at(record, "refswitch", 1) == pytest.approx(50e-6)
    assert switch_cpu_at(record, "refswitch", 3) == pytest.approx(70e-6)
    assert switch_cpu_at(record, "refswitch", 16) == pytest.approx(80e-6)
    assert switch_cpu_at(record, "refswitch", 0) == pytest.approx(50e-6)
    assert switch_pps_of(record, "refswitch", 4) == pytest.approx(1 / 80e-6)
    assert threaded_costs(record, "refswitch", 4).switch_cpu_s == pytest.approx(80e-6)
    # a calibration from before the field: the one-worker cost at every W
    assert switch_cpu_at(RECORD, "refswitch", 4) == pytest.approx(50e-6)


def test_calibration_passes_merge_into_medians_number_by_number() -> None:
    passes = [
        {"date": d, "reps": 3, "targets": {"a": {"cpu": c, "threads": 4}}, "share": s}
        for d, c, s in (("x", 46e-6, 1.0), ("y", 66e-6, 0.5), ("z", 54e-6, 1.0))
    ]
    got = merge_medians(passes)
    assert got["date"] == "x" and got["reps"] == 3 and isinstance(got["reps"], int)
    assert got["targets"]["a"] == {"cpu": 54e-6, "threads": 4}
    assert got["share"] == 1.0


def test_forwarding_costs_a_frame_by_its_size() -> None:
    assert frame_cost(RECORD, "refswitch", 64) == pytest.approx(10e-6)
    assert frame_cost(RECORD, "refswitch", 1514) == pytest.approx(10e-6 + 1450 * 10e-9)
    assert frame_cost(RECORD, "ebpf", 1514) == 0.0  # not calibrated: in the hosts' time

    class Host:
        def __init__(self, mac: str, ip: str) -> None:
            self.mac, self.ip = mac, ip

    frame = udp_frame(
        Host("02:00:00:00:00:01", "10.0.0.1"), Host("", "10.0.0.2"), "02:aa:00:00:00:fe", 1514
    )
    assert len(frame) == 1514 and frame[:6] == bytes.fromhex("02aa000000fe")
    header = frame[14:34]
    assert (
        ipv4_checksum(header[:10] + b"\0\0" + header[12:]) == struct.unpack("!H", header[10:12])[0]
    )
    assert struct.unpack("!H", frame[16:18])[0] == 1500  # IPv4 total length


def test_a_phase_load_counts_the_frames_its_switches_received() -> None:
    def sample(t: float, gloo: int, frames: int) -> str:
        row = {"t": t, "runnable": 3, "groups": 3, "own_groups": 2}
        row |= {"switch_frames": [frames, frames * 1000], "procs": {}}
        return json.dumps(row | {"steps": {"switch": 12, "gloo": gloo}})

    lines = [sample(0.0, 1, 0), sample(1.0, 2, 500), sample(2.0, 4, 4500)]
    got = phase_load(lines, "gloo", 2)
    assert got is not None and (got.switch_frames, got.switch_frame_bytes) == (4000, 4_000_000)
    assert got.own_groups == 2.0 and got.other_groups == 1.0
    # a switch's ports are counted in its own namespace, this process's never
    assert switch_frames([os.getpid()]) == (0, 0)


def test_a_phase_load_spans_its_steps_after_the_warm_up() -> None:
    def sample(t: float, switch: int, gloo: int, groups: int, cpu: float) -> str:
        procs = {
            "10": [cpu, "python -m homagg.refswitch -i 1@s1-eth1"],
            "11": [cpu, "x --mode switch"],
        }
        return json.dumps(
            {
                "t": t,
                "runnable": 9,
                "groups": groups,
                "steps": {"switch": switch, "gloo": gloo},
                "procs": procs,
            }
        )

    lines = [
        sample(0.0, 0, 0, 50, 0.0),  # start-up: not the phase's
        sample(1.0, 2, 0, 4, 1.0),
        sample(2.0, 3, 0, 8, 1.5),
        sample(3.0, 6, 0, 6, 3.0),
        sample(4.0, 6, 1, 40, 9.0),  # the gloo run's start
    ]
    got = phase_load(lines, "switch", 2)
    assert got is not None
    assert (got.seconds, got.steps, got.groups) == (2.0, 4, 6.0)
    assert (got.switch_cpu_s, got.ranks_cpu_s) == (2.0, 2.0)
    assert got.share(2.0) == pytest.approx(1 / 3)
    assert phase_load(lines, "gloo", 2) is None  # never past its warm-up
    assert share_of(2.0, 1.0) == 1.0 and share_of(2.0, 0.0) == 1.0
