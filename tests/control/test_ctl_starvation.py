"""WaitReady cannot starve other tenants: parked calls are bounded per rank (a newer one
supersedes the older), per client and in total, below the number of request threads, so
heartbeats and operator calls always find a thread (homagg/control/waiting.py)."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import grpc
import pytest
from ctl_helpers import HOSTS, make_config

from homagg.api import jobs_pb2
from homagg.api.client import ControllerClient
from homagg.api.errors import ResourceExhausted
from homagg.control.cli import CONCURRENCY_LIMIT_TEXT, main
from homagg.control.config import ConfigError
from homagg.control.service import MAX_QUEUED_PER_THREAD
from homagg.control.waiting import WaitLimiter, client_host


def test_client_host():
    assert client_host("ipv4:10.0.0.1:5000") == "10.0.0.1"
    assert client_host("ipv6:[::1]:5000") == "[::1]"
    assert client_host("unix:/tmp/sock") == "unix:/tmp/sock"


def test_limiter_supersedes_per_rank_and_bounds_clients_and_total():
    woken = []
    lim = WaitLimiter(total=3, per_client=2, wake=lambda: woken.append(1))
    with lim.admit(1, 0, "a", "X") as first, lim.admit(1, 0, "a", "X") as second:
        # the same rank again: the older call is superseded (and woken), no extra room needed
        assert first.superseded and not second.superseded and woken == [1]
        with lim.admit(1, 1, "a", "X"):
            with pytest.raises(ResourceExhausted, match="wait_ready_per_client"):  # noqa: SIM117
                with lim.admit(1, 2, "a", "X"):
                    pass
            with lim.admit(2, 0, "b", "X"):
                assert lim.parked == 4  # the superseded one still holds its thread
                with pytest.raises(ResourceExhausted, match="wait_ready_limit"):  # noqa: SIM117
                    with lim.admit(2, 1, "b", "X"):
                        pass
    assert lim.parked == 0 and lim.refused == 2 and lim.superseded == 1
    with lim.admit(1, 0, "a", "X") as again:  # the rank's slot was freed
        assert not again.superseded


def test_limiter_shares_the_bounds_fairly_between_owners():
    """A call that finds a bound reached takes the newest place of the owner holding at
    least two more than its own owner; else it is refused naming its owner's share."""
    woken = []
    lim = WaitLimiter(total=6, per_client=4, wake=lambda: woken.append(1))
    with ExitStack() as stack:
        b = [stack.enter_context(lim.admit(1, r, "h1" if r < 3 else "h2", "B")) for r in range(6)]
        with pytest.raises(ResourceExhausted, match=r"^B has 6 of the 6 .*wait_ready_limit"):
            stack.enter_context(lim.admit(1, 6, "h2", "B"))
        a0 = stack.enter_context(lim.admit(2, 0, "h3", "A"))  # A's first wait: B gives way
        assert b[5].evicted and not a0.evicted and woken == [1]
        assert lim.held() == {"B": 5, "A": 1} and lim.parked == 7  # the evicted one leaving
        stack.enter_context(lim.admit(2, 1, "h3", "A"))
        stack.enter_context(lim.admit(2, 2, "h3", "A"))  # B 3, A 3: as many as B now
        assert lim.held() == {"B": 3, "A": 3}
        with pytest.raises(ResourceExhausted, match=r"^A has 3 of the 6 .*2 job owner\(s\)"):
            stack.enter_context(lim.admit(2, 3, "h3", "A"))
        with pytest.raises(ResourceExhausted, match=r"^B has 3"):  # an evicted rank retrying
            stack.enter_context(lim.admit(1, 5, "h2", "B"))
        # a third owner's call from h1 finds room there (3 of 4) but not in total: it takes
        # the newest place of B or A
        stack.enter_context(lim.admit(3, 0, "h1", "C"))
        assert sum(lim.held().values()) == 6 and lim.held()["C"] == 1
    assert lim.parked == 0 and lim.evicted == 4 and lim.refused == 3


def test_limiter_shares_a_client_fairly_between_owners():
    lim = WaitLimiter(total=10, per_client=3, wake=lambda: None)
    with ExitStack() as stack:
        b = [stack.enter_context(lim.admit(1, r, "h1", "B")) for r in range(3)]
        with pytest.raises(ResourceExhausted, match=r"^B has 3 of the 3 .*from h1 .*per_client"):
            stack.enter_context(lim.admit(1, 3, "h1", "B"))
        stack.enter_context(lim.admit(2, 0, "h1", "A"))  # another tenant on the same host
        assert [t.evicted for t in b] == ["", "", "wait_ready_per_client"]
        stack.enter_context(lim.admit(1, 3, "h2", "B"))  # B's other host has room
        assert lim.held() == {"B": 3, "A": 1}


def test_wait_limits_are_checked(tmp_path):
    cfg = make_config("127.0.0.1:1", tmp_path)
    assert (cfg.rpc_threads, cfg.wait_ready_limit, cfg.wait_ready_per_client) == (128, 96, 64)
    cfg = make_config("127.0.0.1:1", tmp_path, rpc_threads=8)
    assert (cfg.wait_ready_limit, cfg.wait_ready_per_client) == (6, 4)
    with pytest.raises(ConfigError, match=r"wait_ready_limit: 128 outside 1\.\.96"):
        make_config("127.0.0.1:1", tmp_path, wait_ready_limit=128)
    with pytest.raises(ConfigError, match=r"wait_ready_per_client: 50 outside 1\.\.10"):
        make_config("127.0.0.1:1", tmp_path, wait_ready_limit=10, wait_ready_per_client=50)


def _join(client, job, rank, host, udp_port):
    client.join(job.job_id, job.token, rank, host["mac"], host["ip"], udp_port, host["switch_port"])


def _heartbeat_latencies(client, job, seconds: float) -> list[float]:
    lat, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        client.heartbeat(job.job_id, job.token, 0)
        lat.append(time.monotonic() - t0)
        time.sleep(0.05)
    return lat


@pytest.mark.slow
def test_140_parked_wait_ready_do_not_end_another_job(refswitch, tmp_path, start_controller):
    """The issue's attack: one client parks 140 WaitReady calls on its own job (rank 0
    joined, 128 request threads). Another job's heartbeats stay fast for several leases and
    its job keeps running; status answers."""
    ctl = start_controller(
        make_config(refswitch.address, tmp_path, lease=2.0, heartbeat_interval=0.5)
    )
    c = ctl.client
    hog = c.create_job("hog", 2, "dense", pool_size=4)
    _join(c, hog, 0, HOSTS[0], 41000)
    victim = c.create_job("victim", 1, "dense", pool_size=4)
    _join(c, victim, 0, HOSTS[1], 41000)
    request = jobs_pb2.WaitReadyRequest(job_id=hog.job_id, token=hog.token, rank=0, timeout_s=60)
    parked = [c.stub.WaitReady.future(request, timeout=70) for _ in range(140)]
    try:
        lat = _heartbeat_latencies(c, victim, 3 * 2.0)
        status = c.status()
        assert status.switches[0].connected
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"140 parked WaitReady: heartbeat p99 {p99 * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms")
        assert p99 < 1.0, f"heartbeat p99 {p99:.3f} s"
        [job] = [j for j in c.list_jobs().jobs if j.job_id == victim.job_id]
        assert job.state == "ready"
        ended = [f for f in parked if f.done()]
        assert len(ended) == 139  # every call but the newest was superseded
        assert {f.exception().code() for f in ended} == {grpc.StatusCode.ABORTED}
        assert "superseded" in ended[0].exception().details()
        assert ctl.server.service.waits.parked == 1
    finally:
        for f in parked:
            f.cancel()


def test_clients_over_their_limit_are_refused(refswitch, tmp_path, start_controller):
    """Eight request threads: at most 6 parked calls, 4 per client; heartbeats still answer."""
    ctl = start_controller(make_config(refswitch.address, tmp_path, listen="[::]:0", rpc_threads=8))
    c = ctl.client
    job = c.create_job("wide", 9, "dense", pool_size=4)
    for rank in range(8):
        host = (
            HOSTS[rank]
            if rank < 4
            else {"mac": f"02:00:00:00:02:{rank:02x}", "ip": f"10.0.1.{rank}", "switch_port": 9}
        )
        _join(c, job, rank, host, 41000 + rank)
    other = ControllerClient(f"[::1]:{ctl.port}", timeout=5.0, insecure=True)
    futures = []
    try:
        for rank in range(8):
            client = c if rank < 5 else other
            req = jobs_pb2.WaitReadyRequest(
                job_id=job.job_id, token=job.token, rank=rank, timeout_s=30
            )
            futures.append(client.stub.WaitReady.future(req, timeout=40))
            time.sleep(0.2)  # in order: ranks 0..3 admitted, rank 4 over the client limit
        assert [f.done() for f in futures] == [False] * 4 + [True, False, False, True]
        assert futures[4].exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "wait_ready_per_client" in futures[4].exception().details()
        assert "wait_ready_limit" in futures[7].exception().details()
        lat = _heartbeat_latencies(c, job, 1.0)
        assert max(lat) < 1.0
    finally:
        for f in futures:
            f.cancel()
        other.close()
    deadline = time.monotonic() + 5
    while ctl.server.service.waits.parked and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ctl.server.service.waits.parked == 0  # cancelled clients freed their threads


def test_calls_past_the_concurrency_limit_are_resource_exhausted(
    refswitch, tmp_path, start_controller, monkeypatch, capsys
):
    """4 request threads: at most 4 x 4 = 16 calls in progress or queued. With every
    heartbeat held in the job manager (a stand-in for calls that take long), 20 heartbeats
    leave 4 answered RESOURCE_EXHAUSTED at once with gRPC's text, which aggctl explains; the
    16 admitted ones complete once released."""
    ctl = start_controller(make_config(refswitch.address, tmp_path, rpc_threads=4))
    c = ctl.client
    job = c.create_job("busy", 1, "dense", pool_size=4)
    _join(c, job, 0, HOSTS[0], 41000)
    gate = threading.Event()
    real = ctl.manager.heartbeat

    def held(*args):
        gate.wait(30)
        return real(*args)

    monkeypatch.setattr(ctl.manager, "heartbeat", held)
    limit = 4 * MAX_QUEUED_PER_THREAD
    request = jobs_pb2.HeartbeatRequest(job_id=job.job_id, token=job.token, rank=0)
    calls = []
    try:
        for _ in range(limit + 4):
            calls.append(c.stub.Heartbeat.future(request, timeout=30))
            time.sleep(0.02)  # accepted in order
        deadline = time.monotonic() + 5
        while sum(f.done() for f in calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = [f for f in calls if f.done()]
        assert len(refused) == 4 and refused == calls[limit:]
        for f in refused:
            assert f.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f.exception().details().startswith(CONCURRENCY_LIMIT_TEXT)
        assert main(["--insecure", "--controller", ctl.address, "status"]) == 1
        err = capsys.readouterr().err
        assert "RESOURCE_EXHAUSTED: Concurrent RPC limit exceeded" in err
        assert "4 x controller.rpc_threads calls in progress or queued" in err
    finally:
        gate.set()
    for f in calls[:limit]:
        assert f.result().state == "ready"
    assert c.heartbeat(job.job_id, job.token, 0).state == "ready"  # room again
