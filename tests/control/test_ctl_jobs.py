"""The job lifecycle over real gRPC, against each switch target: what the controller answers and
what the switch really holds afterwards (read back over P4Runtime)."""

from __future__ import annotations

import re
import threading
import time

import grpc
import pytest
from ctl_helpers import (
    HOSTS,
    SERVICE_IP,
    SWITCH_MAC,
    job_state,
    join_all,
    make_config,
    rpc_code,
    wait_for,
)

from homagg.control.artifacts import P4INFO_PATH
from homagg.control.job_record import GaveUp
from homagg.p4rt.bytestrings import ipv4_to_int
from homagg.p4rt.p4info import P4InfoIndex
from homagg.wire import p4names
from homagg.wire.constants import AGG_UDP_PORT, CELLS_PER_PKT, NUM_SLOTS

OK_JOIN = dict(
    rank=0,
    mac=HOSTS[0]["mac"],
    ip=HOSTS[0]["ip"],
    udp_port=41000,
    switch_port=HOSTS[0]["switch_port"],
)


def test_pipeline_and_forwarding_are_pushed(switch, reader, tmp_path, start_controller):
    switch.restart()  # no pipeline
    controller = start_controller(make_config(switch.address, tmp_path))
    conn = reader()
    assert conn.get_p4info().proto == P4InfoIndex.from_text_file(P4INFO_PATH).proto
    arp = {e.match["hdr.arp.tpa"] for e in conn.read_entries(p4names.ARP_RESPONDER)}
    assert arp == {ipv4_to_int(h["ip"]) for h in HOSTS} | {ipv4_to_int(SERVICE_IP)}
    routes = {e.match["hdr.ipv4.dst_addr"]: e.action for e in conn.read_entries(p4names.IPV4_LPM)}
    assert routes[(ipv4_to_int(SERVICE_IP), 32)] == p4names.AGGREGATE
    assert routes[(ipv4_to_int(HOSTS[1]["ip"]), 32)] == p4names.ROUTE
    status = controller.client.status().switches[0]
    assert status.connected and status.pipeline_pushes == 1 and status.slots_used == 0


def test_create_join_ready_leave(controller, reader):
    c = controller.client
    job = c.create_job("resnet", 3, "dense-fixed", pool_size=16)
    assert job.job_id >= 1 and len(job.token) >= 32 and job.switch == "s1" and job.pool_size == 16
    first = join_all(c, job, HOSTS[:2])
    assert [r.joined for r in first] == [1, 2] and not first[-1].ready
    assert job_state(reader())["jobs"] == {}  # nothing installed while ranks are missing

    waiter: dict = {}
    thread = threading.Thread(
        target=lambda: waiter.update(a=c.wait_ready(job.job_id, job.token, 0, 10))
    )
    thread.start()
    last = c.join(
        job.job_id, job.token, 2, HOSTS[2]["mac"], HOSTS[2]["ip"], 41002, HOSTS[2]["switch_port"]
    )
    assert last.ready and last.joined == 3
    thread.join(10)
    a = waiter["a"]
    assert (a.job_id, a.rank, a.world_size, a.switch) == (job.job_id, 0, 3, "s1")
    assert (a.service_ip, a.udp_port, a.switch_mac) == (SERVICE_IP, AGG_UDP_PORT, SWITCH_MAC)
    assert (a.pool_size, a.cells_per_packet, a.codec) == (16, CELLS_PER_PKT, "dense-fixed")
    assert a.heartbeat_interval_s == pytest.approx(0.5) and a.lease_s == pytest.approx(3.0)
    assert a.lane_ops  # the v1model program adds ADD16 / ADD8 lanes

    held = job_state(reader())
    pool_base = c.list_jobs().jobs[0].pool_base
    assert held["jobs"] == {
        job.job_id: {
            "pool_base": pool_base,
            "pool_size": 16,
            "num_workers": 3,
            "mcast_grp": job.job_id,
        }
    }
    assert held["workers"] == held["rewrites"] == [(job.job_id, r) for r in range(3)]
    assert sorted(held["groups"][job.job_id]) == [(1, 1), (2, 2), (3, 3)]
    assert c.heartbeat(job.job_id, job.token, 1).state == "ready"

    assert not c.leave(job.job_id, job.token, 0).job_ended
    assert not c.leave(job.job_id, job.token, 1).job_ended
    assert job_state(reader())["jobs"]  # still aggregating for the last rank
    assert c.leave(job.job_id, job.token, 2).job_ended
    assert job_state(reader()) == {"jobs": {}, "workers": [], "rewrites": [], "groups": {}}
    assert (
        c.list_jobs().jobs == []
        and c.list_jobs(include_ended=True).jobs[0].end_reason == "every rank left"
    )
    assert [(r.base, r.size, r.job_id) for r in c.list_pools().ranges] == [(0, NUM_SLOTS, 0)]
    code, details = rpc_code(lambda: c.heartbeat(job.job_id, job.token, 2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ended" in details


def test_two_jobs_side_by_side(controller, reader):
    c = controller.client
    a = c.create_job("a", 2, "dense", pool_size=100)
    b = c.create_job("b", 2, "sparse", pool_size=50)
    assert b.job_id > a.job_id
    join_all(c, a, HOSTS[:2])
    join_all(c, b, HOSTS[2:4], udp_base=42000)
    jobs = {j.job_id: j for j in c.list_jobs().jobs}
    ra = range(jobs[a.job_id].pool_base, jobs[a.job_id].pool_base + 100)
    rb = range(jobs[b.job_id].pool_base, jobs[b.job_id].pool_base + 50)
    assert not set(ra) & set(rb)
    assert {j.state for j in jobs.values()} == {"ready"}
    held = job_state(reader())
    assert set(held["jobs"]) == {a.job_id, b.job_id} and set(held["groups"]) == {a.job_id, b.job_id}
    assert held["jobs"][b.job_id]["pool_base"] == rb.start
    pools = [(r.base, r.size, r.job_id) for r in c.list_pools().ranges]
    assert pools == [(0, 100, a.job_id), (100, 50, b.job_id), (150, NUM_SLOTS - 150, 0)]
    status = c.status().switches[0]
    assert (status.slots_used, status.jobs) == (150, 2)


def test_one_endpoint_per_switch_across_jobs(controller, reader):
    """Two running jobs on one switch cannot deliver to the same (IP, UDP port): the second
    join is refused naming the first job; another port is fine, and the endpoint is free
    again once the first job ended."""
    c = controller.client
    h0, h1 = HOSTS[0], HOSTS[1]
    first = c.create_job("first", 1, "dense", pool_size=4)
    c.join(first.job_id, first.token, 0, h0["mac"], h0["ip"], 41000, h0["switch_port"])
    second = c.create_job("second", 2, "dense", pool_size=4)
    code, details = rpc_code(
        lambda: c.join(second.job_id, second.token, 0, h0["mac"], h0["ip"], 41000, 1)
    )
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert f"10.0.0.1:41000 is already used by rank 0 of job {first.job_id} (first)" in details
    assert "bind another UDP port" in details
    [job] = [j for j in c.list_jobs().jobs if j.job_id == second.job_id]
    assert job.joined == 0  # nothing changed
    c.join(second.job_id, second.token, 0, h0["mac"], h0["ip"], 41001, h0["switch_port"])
    c.release(first.job_id)
    c.join(second.job_id, second.token, 1, h1["mac"], h1["ip"], 41000, h1["switch_port"])
    third = c.create_job("third", 1, "dense", pool_size=4)
    assert c.join(third.job_id, third.token, 0, h0["mac"], h0["ip"], 41000, 1).ready
    assert set(job_state(reader())["jobs"]) == {second.job_id, third.job_id}


def test_pool_exhaustion_is_resource_exhausted(controller):
    c = controller.client
    big = c.create_job("big", 1, "dense", pool_size=NUM_SLOTS - 10)
    code, details = rpc_code(lambda: c.create_job("more", 1, "dense", pool_size=11))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "largest free range: 10" in details
    assert [j.job_id for j in c.list_jobs().jobs] == [big.job_id]
    assert c.create_job("fits", 1, "dense", pool_size=10).pool_size == 10
    c.release(big.job_id)
    assert c.create_job("again", 1, "dense", pool_size=11).pool_size == 11


def test_lease_expiry_reclaims_everything(switch, reader, tmp_path, start_controller):
    # the lease outlasts join_all under load (a 1 s lease expired during it at load ~30)
    c = start_controller(
        make_config(switch.address, tmp_path, lease=2.0, heartbeat_interval=0.4)
    ).client
    job = c.create_job("short", 2, "dense", pool_size=8)
    join_all(c, job, HOSTS[:2])
    assert job_state(reader())["jobs"]
    deadline = time.monotonic() + 1.8
    while time.monotonic() < deadline:  # rank 1 keeps beating, rank 0 went silent after joining
        c.heartbeat(job.job_id, job.token, 1)
        time.sleep(0.3)
    wait_for(lambda: not c.list_jobs().jobs, 5, "the lease to expire")
    ended = c.list_jobs(include_ended=True).jobs[0]
    assert ended.state == "ended" and re.search(r"lease of ranks? 0\b.* expired", ended.end_reason)
    # An ended job's entries are removed by its switch's writer, after the job ended:
    # the job entry first (its packets stop), the rest within a poll or two.
    empty = {"jobs": {}, "workers": [], "rewrites": [], "groups": {}}
    wait_for(lambda: job_state(reader()) == empty, 3, "the ended job's entries to go")
    assert c.status().switches[0].slots_used == 0
    code, details = rpc_code(lambda: c.heartbeat(job.job_id, job.token, 1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "has ended: lease of rank" in details


def test_job_nobody_holds_ends_after_join_timeout(switch, tmp_path, start_controller):
    c = start_controller(make_config(switch.address, tmp_path, join_timeout=0.5)).client
    job = c.create_job("orphan", 2, "dense", pool_size=8)
    c.join(job.job_id, job.token, **OK_JOIN)
    assert not c.leave(job.job_id, job.token, 0).job_ended  # before the world is complete: un-joins
    assert c.list_jobs().jobs[0].joined == 0
    wait_for(lambda: not c.list_jobs().jobs, 3, "the join timeout")
    assert c.list_jobs(include_ended=True).jobs[0].end_reason == "no live rank for 0.5 s"
    assert c.status().switches[0].slots_used == 0


def test_wait_times_out_with_missing_ranks(controller):
    c = controller.client
    job = c.create_job("slow", 3, "dense")
    c.join(job.job_id, job.token, **OK_JOIN)
    start = time.monotonic()
    code, details = rpc_code(lambda: c.wait_ready(job.job_id, job.token, 0, 0.3))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "missing ranks [1, 2]" in details
    assert time.monotonic() - start < 3


def test_release_by_operator(controller, reader):
    c = controller.client
    job = c.create_job("doomed", 1, "dense", pool_size=4)
    c.join(job.job_id, job.token, **OK_JOIN)
    assert job_state(reader())["jobs"]
    released = c.release(job.job_id).job
    assert released.state == "ended" and released.end_reason == "released by the operator"
    assert job_state(reader())["jobs"] == {}
    code, _ = rpc_code(lambda: c.release(job.job_id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = rpc_code(lambda: c.release(999))
    assert code == grpc.StatusCode.NOT_FOUND


@pytest.fixture
def patient(switch, tmp_path, start_controller):
    """A controller whose leases outlast a switch's stop and start: these tests' ranks send
    no heartbeat, and the module's 3 s lease ran out during a restart under load (the job
    ended, its entries with it)."""
    return start_controller(make_config(switch.address, tmp_path, lease=120.0))


def test_switch_restart_repushes_pipeline_and_entries(switch, patient, reader):
    c = patient.client
    job = c.create_job("survivor", 2, "dense", pool_size=32)
    join_all(c, job, HOSTS[:2])
    before = job_state(reader())
    pushes, connects = c.status().switches[0].pipeline_pushes, c.status().switches[0].connects
    switch.restart()

    def repushed() -> bool:
        s = c.status().switches[0]
        return s.connected and (s.pipeline_pushes, s.connects) == (pushes + 1, connects + 1)

    wait_for(repushed, 15, "the controller to re-push the restarted switch")
    assert c.list_jobs().jobs[0].state == "ready"
    assert job_state(reader()) == before
    assert len(reader().read_entries(p4names.ARP_RESPONDER)) == len(HOSTS) + 1
    assert c.heartbeat(job.job_id, job.token, 0).state == "ready"


def test_unreachable_switch_is_unavailable_until_it_returns(switch, patient, reader):
    c = patient.client
    job = c.create_job("patient", 2, "dense", pool_size=8)
    c.join(job.job_id, job.token, **OK_JOIN)
    switch.stop()
    wait_for(lambda: not c.status().switches[0].connected, 5, "the controller to notice")
    last = c.join(
        job.job_id, job.token, 1, HOSTS[1]["mac"], HOSTS[1]["ip"], 41001, HOSTS[1]["switch_port"]
    )
    assert last.joined == 2 and not last.ready  # the join stands
    start = time.monotonic()
    code, details = rpc_code(lambda: c.wait_ready(job.job_id, job.token, 0, 0.5))
    assert code == grpc.StatusCode.UNAVAILABLE and "unreachable" in details
    assert 0.4 < time.monotonic() - start < 3
    assert c.list_jobs().jobs[0].state == "installing"
    code, _ = rpc_code(lambda: c.counters(switch="s1"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert c.counters().switches[0].error
    switch.start()
    assignment = c.wait_ready(job.job_id, job.token, 1, 15)
    assert assignment.rank == 1 and job_state(reader())["jobs"]


def test_counters_per_job_and_reason(controller):
    c = controller.client
    job = c.create_job("counted", 2, "dense")
    join_all(c, job, HOSTS[:2])
    [sw] = c.counters().switches
    assert sw.switch == "s1" and not sw.error
    assert {d.name for d in sw.ingress_drops} >= {"UNKNOWN_JOB", "BAD_RANK", "WRONG_PORT", "STALE"}
    assert [d.name for d in sw.egress_drops] == ["NO_RECIPIENT"]
    assert [e.name for e in sw.events] == ["CONTRIBUTION", "RESULT", "RESENT", "PARTIAL"]
    assert [(j.job_id, j.name, [w.rank for w in j.workers]) for j in sw.jobs] == [
        (job.job_id, "counted", [0, 1])
    ]
    assert [j.job_id for j in c.counters(job_id=job.job_id).switches[0].jobs] == [job.job_id]
    assert rpc_code(lambda: c.counters(job_id=4242))[0] == grpc.StatusCode.NOT_FOUND


def test_switch_port_from_the_topology(controller):
    """A join without switch_port gets the port the configuration lists for its IP; a host
    the topology does not know must name its port."""
    c = controller.client
    job = c.create_job("attach", 2, "lossless")
    h0, h1 = HOSTS[0], HOSTS[1]
    c.join(job.job_id, job.token, 0, h0["mac"], h0["ip"], 41000)
    c.join(job.job_id, job.token, 1, h1["mac"], h1["ip"], 41001)
    workers = {w.rank: w for w in c.list_jobs().jobs[0].workers}
    assert (workers[0].switch_port, workers[1].switch_port) == (
        h0["switch_port"],
        h1["switch_port"],
    )
    other = c.create_job("stranger", 1, "lossless")
    code, details = rpc_code(
        lambda: c.join(other.job_id, other.token, 0, "02:00:00:00:09:09", "10.9.9.9", 41000)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "pass the switch port" in details
    code, details = rpc_code(  # the MAC is still checked against the topology
        lambda: c.join(other.job_id, other.token, 0, "02:00:00:00:09:09", h0["ip"], 41005)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "per the topology" in details


def test_heartbeats_carry_the_newest_give_up_to_every_rank(controller):
    """A rank's heartbeat that says it gave up a call is recorded (the newest call's wins)
    and every heartbeat answer of the job carries it, its reason cut to one line of 300
    characters; another job's answers carry nothing."""
    c = controller.client
    job = c.create_job("told", 2, "dense", pool_size=8)
    other = c.create_job("other", 1, "dense", pool_size=8)
    join_all(c, job, HOSTS[:2])
    join_all(c, other, HOSTS[2:3])
    assert not c.heartbeat(job.job_id, job.token, 1).HasField("gave_up")
    c.heartbeat(job.job_id, job.token, 0, GaveUp(9, 40, "path gone\n" * 100))
    told = c.heartbeat(job.job_id, job.token, 1).gave_up
    assert (told.rank, told.chunk) == (0, 40)  # the request's rank, not the message's
    assert len(told.reason) == GaveUp.MAX_REASON and "\n" not in told.reason
    assert told.reason.startswith("path gone path gone")
    c.heartbeat(job.job_id, job.token, 1, GaveUp(1, 12, "an older call"))
    again = c.heartbeat(job.job_id, job.token, 0).gave_up
    assert (again.rank, again.chunk) == (0, 40)
    c.heartbeat(job.job_id, job.token, 1, GaveUp(1, 41, "a newer call"))
    assert c.heartbeat(job.job_id, job.token, 0).gave_up.reason == "a newer call"
    assert not c.heartbeat(other.job_id, other.token, 0).HasField("gave_up")
    counts = {j.job_id: j.gave_ups for j in c.list_jobs().jobs}  # calls 40 and 41, told again
    assert counts == {job.job_id: 2, other.job_id: 0}
