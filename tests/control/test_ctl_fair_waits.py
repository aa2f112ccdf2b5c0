"""No tenant's waiting WaitReady calls hold another tenant's jobs back (homagg/control/waiting.py):
the calls that may wait at once (controller.wait_ready_limit, 96 with the default 128 request
threads) are shared between job owners, so a tenant that fills the limit gives way to another
tenant's first wait, whose job starts at once, and tenants waiting together get equal
shares. Tenants with their default quotas, workers of the big jobs on two hosts (client
addresses 127.0.0.1 and ::1), the small job's agents on one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from ctl_helpers import HOSTS, RunningController, config_dict

from homagg.api import jobs_pb2
from homagg.api.client import ControllerClient
from homagg.api.credentials import hash_token
from homagg.control.config import parse_config
from homagg.lab.poll import wait_for
from homagg.lab.switch_process import free_port
from homagg.worker.job.agent import AgentConfig, WorkerAgent

TENANTS = ["bob", "carol", "dave", "erin"]
WORLD = 32
RETRY_S = 0.2  # between a refused wait and its retry (the agent's READY_RETRY_S: 0.5 s)


class Tenants:
    """A controller with an admin, the tenants above and 'alice', each a client per host."""

    def __init__(self, switch_address: str, tmp_path: Any) -> None:
        doc = config_dict([("s1", switch_address, HOSTS)], tmp_path, listen="localhost:0")
        doc["controller"].update(lease=30.0, heartbeat_interval=5.0)
        doc["operator"] = [{"name": "root", "token_sha256": hash_token("root"), "role": "admin"}]
        doc["operator"] += [
            {"name": name, "token_sha256": hash_token(name)} for name in [*TENANTS, "alice"]
        ]
        self.ctl = RunningController(parse_config(doc, tmp_path), operator_token="root")
        self.clients: list[ControllerClient] = []

    def client(self, name: str, host: str = "127.0.0.1") -> ControllerClient:
        c = ControllerClient(f"{host}:{self.ctl.port}", 5.0, operator_token=name, insecure=True)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.ctl.stop()


@pytest.fixture
def tenants(refswitch, tmp_path) -> Iterator[Tenants]:
    t = Tenants(refswitch.address, tmp_path)
    try:
        t.ctl.wait_synced()
        yield t
    finally:
        t.close()


@dataclass
class BigJob:
    """A 32-rank job and its tenant's client on each of its two hosts (rank % 2)."""

    job_id: int
    token: str
    hosts: list[ControllerClient]


def big_job(t: Tenants, tenant: str, index: int) -> BigJob:
    """A 32-rank job of `tenant` whose ranks but the last joined from two hosts."""
    hosts = [t.client(tenant, "127.0.0.1"), t.client(tenant, "[::1]")]
    created = hosts[0].create_job(f"{tenant}-{index}", WORLD, "dense", pool_size=16)
    job = BigJob(created.job_id, created.token, hosts)
    for rank in range(WORLD - 1):
        join(job, index, rank)
    return job


def join(job: BigJob, index: int, rank: int) -> None:
    h = HOSTS[rank % 2]
    port = 42000 + 100 * index + rank
    job.hosts[0].join(job.job_id, job.token, rank, h["mac"], h["ip"], port, h["switch_port"])


def park(job: BigJob, rank: int, timeout_s: float = 300) -> Any:
    """A WaitReady of `rank` from its host, as a future."""
    request = jobs_pb2.WaitReadyRequest(
        job_id=job.job_id, token=job.token, rank=rank, timeout_s=timeout_s
    )
    return job.hosts[rank % 2].stub.WaitReady.future(request, timeout=timeout_s + 10)


def start_small_job(t: Tenants) -> tuple[float, list[WorkerAgent]]:
    """alice's two-rank job started by two worker agents (join, WaitReady retried while
    refused, heartbeats) on a third host: how long until both have their assignment."""
    c = t.client("alice")
    job = c.create_job("alice", 2, "dense", pool_size=16)
    agents: list[Any] = [None, None]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        h = HOSTS[2 + rank]
        cfg = AgentConfig(
            controller=c.address,
            job_id=job.job_id,
            token=job.token,
            rank=rank,
            ip="127.0.0.1",
            udp_port=free_port(),
            switch_port=h["switch_port"],
            mac=h["mac"],
            ready_timeout=10.0,
            insecure=True,
        )
        try:
            agents[rank] = WorkerAgent(cfg)
        except BaseException as exc:
            errors.append(exc)

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    threads[0].start()
    waits = t.ctl.server.service.waits  # rank 1 completes the job once rank 0 waits
    wait_for(lambda: waits.held()["operator 'alice'"] or errors, 10, "alice's rank 0 to wait")
    threads[1].start()
    for th in threads:
        th.join(20)
    took = time.monotonic() - start
    started = [a for a in agents if a is not None]
    assert not errors and len(started) == 2, errors
    return took, started


def test_a_tenant_that_fills_the_limit_gives_way_to_another_tenants_job(tenants):
    """The issue's attack: bob, within his default quotas, parks 96 waits (four 32-rank jobs
    on two hosts, each missing its last rank); alice's job starts within a second anyway,
    where it was refused for its whole ready timeout before."""
    t = tenants
    jobs = [big_job(t, "bob", i) for i in range(4)]
    parked = [park(job, rank) for job in jobs for rank in range(WORLD - 1)]
    try:
        wait_for(lambda: sum(f.done() for f in parked) == 4 * 31 - 96, 10, "bob's waits")
        refused = [f for f in parked if f.done()]
        assert {f.code() for f in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert "operator 'bob' has 96 of the 96 WaitReady calls waiting" in refused[0].details()
        assert "wait_ready_limit" in refused[0].details()
        took, agents = start_small_job(t)
        for a in agents:
            a.close()
        print(f"alice's job started in {took:.2f} s with bob's 96 waits parked")
        assert took < 1.0
        gave_way = [f for f in parked if f.done() and f not in refused]
        # alice's first wait took the place of bob's newest; her second call found her job
        # installed and parked nothing
        assert len(gave_way) == 1
        assert gave_way[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "gave its place to another job owner's" in gave_way[0].details()
        assert "(controller.wait_ready_limit)" in gave_way[0].details()
        assert t.ctl.server.service.waits.held() == {"operator 'bob'": 95}
    finally:
        for f in parked:
            f.cancel()


def retried_wait(job: Any, rank: int, deadline: float, out: dict) -> None:
    """WaitReady of `rank`, retried while refused as over a limit (as the agent does)."""
    while True:
        try:
            out[(job.job_id, rank)] = park(job, rank, 30).result()
            return
        except grpc.RpcError as exc:
            busy = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            if not busy or time.monotonic() > deadline:
                out[(job.job_id, rank)] = exc
                return
        time.sleep(RETRY_S)


def test_four_tenants_waiting_for_late_ranks_share_the_limit_and_all_start(tenants):
    """No malice: four tenants' 32-rank jobs, each waiting for a late rank (124 calls for 96
    places). The waits settle at equal shares, a fifth tenant's job starts within a second,
    and when the late ranks come every rank of every job gets its assignment."""
    t = tenants
    jobs = [big_job(t, tenant, i) for i, tenant in enumerate(TENANTS)]
    out: dict = {}
    deadline = time.monotonic() + 60
    waiters = [
        threading.Thread(target=retried_wait, args=(job, rank, deadline, out), daemon=True)
        for job in jobs
        for rank in range(WORLD - 1)
    ]
    for th in waiters:
        th.start()
    try:
        waits = t.ctl.server.service.waits
        fair = {f"operator {name!r}": 96 // len(TENANTS) for name in TENANTS}
        wait_for(lambda: waits.held() == fair, 20, f"the waits to settle at {fair}")
        took, agents = start_small_job(t)
        for a in agents:
            a.close()
        print(f"alice's job started in {took:.2f} s beside four tenants' 96 waits")
        assert took < 1.0
        for index, job in enumerate(jobs):  # the late ranks come
            join(job, index, WORLD - 1)
    finally:
        for th in waiters:
            th.join(max(0.1, deadline - time.monotonic()))
    failed = {k: v for k, v in out.items() if isinstance(v, Exception)}
    assert not failed and len(out) == 4 * 31, failed
