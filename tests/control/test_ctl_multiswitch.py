"""Several switches under one controller: a job lives on the switch of its workers; a job
whose workers sit on different switches is refused (multi-switch jobs are out of scope)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from ctl_helpers import HOSTS, SwitchUnderTest, config_dict, job_state, rpc_code

from homagg.control.config import parse_config
from homagg.control.switch_connection import SwitchConnection
from homagg.wire.constants import CELLS_PER_PKT

S1_HOSTS, S2_HOSTS = HOSTS[:2], HOSTS[2:]


# s2 says its program carries 64 cells per packet (as a Tofino switch's would): the
# assignment of a job there says so; nothing in these tests sends a packet to s2 at 64.
S2_CELLS = 64


@pytest.fixture
def two(tmp_path: Path, start_controller):
    switches = [SwitchUnderTest("refswitch", tmp_path), SwitchUnderTest("refswitch", tmp_path)]
    doc = config_dict(
        [("s1", switches[0].address, S1_HOSTS), ("s2", switches[1].address, S2_HOSTS)], tmp_path
    )
    doc["switch"][1]["cells_per_packet"] = S2_CELLS
    ctl = start_controller(parse_config(doc, tmp_path))
    readers = []
    for _i, sw in enumerate(switches):
        conn = SwitchConnection(sw.address, election_id=1, timeout=3.0)
        conn.connect(require_primary=False)
        readers.append(conn)
    yield ctl, readers
    for conn in readers:
        conn.close()
    for sw in switches:
        sw.stop()


def join(c, job, rank, host, udp=41000):
    return c.join(
        job.job_id, job.token, rank, host["mac"], host["ip"], udp + rank, host["switch_port"]
    )


def test_job_goes_to_the_switch_of_its_workers(two):
    ctl, (r1, r2) = two
    c = ctl.client
    job = c.create_job("on-s2", 2, "dense", pool_size=32)
    assert job.switch == "" and job.pool_size == 32  # the switch is not known until a worker joins,
    assert {s.slots_used for s in c.status().switches} == {0}  # so no pool is allocated yet
    join(c, job, 0, S2_HOSTS[0])
    join(c, job, 1, S2_HOSTS[1])
    [info] = c.list_jobs().jobs
    assert (info.switch, info.state, info.pool_size) == ("s2", "ready", 32)
    assert list(job_state(r2)["jobs"]) == [job.job_id] and job_state(r1)["jobs"] == {}
    pinned = c.create_job("pinned", 1, "dense", pool_size=8, switch="s1")
    assert pinned.switch == "s1" and pinned.pool_size == 8
    assert {(s.name, s.slots_used, s.jobs) for s in c.status().switches} == {
        ("s1", 8, 1),
        ("s2", 32, 1),
    }


def test_each_switch_hands_out_its_cells_per_packet(two):
    """One controller, a switch per program: a job's workers pack as many cells as their
    switch's program takes."""
    ctl, _ = two
    c = ctl.client
    got = {}
    for name, host in (("s1", S1_HOSTS[0]), ("s2", S2_HOSTS[0])):
        job = c.create_job(f"on-{name}", 1, "dense", pool_size=4, switch=name)
        join(c, job, 0, host)
        got[name] = c.wait_ready(job.job_id, job.token, 0, 10).cells_per_packet
    assert got == {"s1": CELLS_PER_PKT, "s2": S2_CELLS}


def test_each_switch_grants_pools_up_to_its_own_limit(tmp_path, start_controller):
    """A switch's max_pool_size (BMv2's ports buffer ~1,300 frames: docs/bmv2.md) caps the
    pool a job gets there, whether the switch is named at creation or chosen at the first
    join; the workers' assignment carries the pool granted; smaller requests are kept."""
    switches = [SwitchUnderTest("refswitch", tmp_path), SwitchUnderTest("refswitch", tmp_path)]
    doc = config_dict(
        [("s1", switches[0].address, S1_HOSTS), ("s2", switches[1].address, S2_HOSTS)], tmp_path
    )
    doc["switch"][1]["max_pool_size"] = 16
    try:
        c = start_controller(parse_config(doc, tmp_path)).client
        pinned = c.create_job("pinned", 1, "dense", pool_size=64, switch="s2")
        small = c.create_job("small", 1, "dense", pool_size=8, switch="s2")
        on_s1 = c.create_job("on-s1", 1, "dense", pool_size=64, switch="s1")
        assert (pinned.pool_size, small.pool_size, on_s1.pool_size) == (16, 8, 64)
        later = c.create_job("later", 1, "dense", pool_size=4096)
        assert later.switch == "" and later.pool_size == 4096  # not placed yet
        join(c, later, 0, S2_HOSTS[0])
        ready = c.wait_ready(later.job_id, later.token, 0, timeout_s=10)
        assert ready.pool_size == 16
        assert {(j.name, j.pool_size) for j in c.list_jobs().jobs} == {
            ("pinned", 16),
            ("small", 8),
            ("on-s1", 64),
            ("later", 16),
        }
        assert {(s.name, s.slots_used) for s in c.status().switches} == {("s1", 64), ("s2", 40)}
    finally:
        for sw in switches:
            sw.stop()


def test_workers_on_two_switches_are_refused(two):
    ctl, (_r1, _r2) = two
    c = ctl.client
    job = c.create_job("split", 2, "dense")
    join(c, job, 0, S1_HOSTS[0])
    code, details = rpc_code(lambda: join(c, job, 1, S2_HOSTS[0]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "several switches" in details
    assert c.list_jobs().jobs[0].joined == 1


def test_unknown_host_cannot_choose_the_switch(two):
    ctl, _ = two
    c = ctl.client
    job = c.create_job("where", 1, "dense")
    stranger = {"mac": "02:00:00:00:0a:0a", "ip": "10.9.9.9", "switch_port": 7}
    code, details = rpc_code(lambda: join(c, job, 0, stranger))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "name the switch" in details
    assert c.list_jobs().jobs[0].switch == ""
    pinned = c.create_job("there", 1, "dense", switch="s2")
    assert join(
        c, pinned, 0, stranger
    ).ready  # hosts outside the topology are fine once the switch is known
