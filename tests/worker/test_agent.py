"""The worker agent against an in-process controller: join, assignment, heartbeats, leave,
clear errors; and through a fabric's switch (namespaces), exact sums with the transport
built from the assignment."""

from __future__ import annotations

import re
import threading
import time

import grpc
import numpy as np
import pytest

from homagg.control.job_record import GaveUp
from homagg.lab.controlled import Controlled
from homagg.lab.namespace import have_privileges
from homagg.lab.poll import wait_for
from homagg.wire.constants import AGG_UDP_PORT, CELLS_PER_PKT, Flag, Op
from homagg.wire.header import header_view
from homagg.worker.job.agent import AgentConfig, AgentError, WorkerAgent, open_agent

needs_root = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("agent-ctl"), 2, fabric=False)
    yield c
    c.close()


@pytest.fixture(scope="module")
def fab(tmp_path_factory):
    if not have_privileges():
        pytest.skip("needs root and iproute2 (network namespaces)")
    c = Controlled(tmp_path_factory.mktemp("agent-fabric"), 2, fabric=True)
    yield c
    c.close()


def open_all(c: Controlled, job, world: int, **kw) -> list[WorkerAgent]:
    """Open one agent per rank concurrently (WaitReady blocks until all joined)."""
    agents: list = [None] * world
    errors: list = []

    def run(r: int) -> None:
        try:
            agents[r] = WorkerAgent(c.agent_config(job, r, **kw), c.socket_factory(r))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors or any(t.is_alive() for t in threads):
        for a in agents:
            if a is not None:
                a.close()
        raise errors[0] if errors else AssertionError("an agent hung")
    return agents


def test_join_assignment_heartbeat_and_leave(ctl):
    job = ctl.create(2, codec="lossless", pool_size=8)
    agents = open_all(ctl, job, 2)
    try:
        for r, a in enumerate(agents):
            asg = a.assignment
            assert (asg.job_id, asg.rank, asg.world_size, asg.pool_size) == (job.job_id, r, 2, 8)
            assert (
                asg.service_ip == "10.0.0.254"
                and asg.udp_port == AGG_UDP_PORT
                and asg.codec == "lossless"
            )
            cfg = a.transport.config
            assert (cfg.job_id, cfg.rank, cfg.world_size, cfg.pool_size) == (job.job_id, r, 2, 8)
            assert a.healthy
        wait_for(lambda: all(a.heartbeats >= 2 for a in agents), 5, "two heartbeats per rank")
    finally:
        for a in agents:
            a.close()
    assert not any(j.job_id == job.job_id for j in ctl.client.list_jobs().jobs)  # every rank left
    assert all(not a.healthy for a in agents)


class CountingSwitch:
    """A one-rank switch that answers each contribution at the next look at the socket and
    records the most chunks the rank had in flight at once."""

    def __init__(self) -> None:
        self.waiting: list[bytes] = []
        self.most_in_flight = 0

    def send(self, payload: bytes) -> None:
        self.waiting.append(payload)
        self.most_in_flight = max(self.most_in_flight, len(self.waiting))

    def recv(self, timeout: float) -> bytes | None:
        if not self.waiting:
            return None
        reply = np.frombuffer(self.waiting.pop(0), np.uint8).copy()
        header_view(reply)["flags"] = int(Flag.RESULT)
        return reply.tobytes()

    def close(self) -> None:
        pass


def test_the_worker_keeps_to_the_pool_its_switch_grants(tmp_path):
    """A switch whose ports buffer few frames (max_pool_size, docs/bmv2.md) grants a smaller
    pool than the job asked for; the agent's transport keeps that many chunks in flight."""
    c = Controlled(tmp_path, 1, fabric=False, max_pool_size=8)
    try:
        job = c.create(1, pool_size=64)
        assert job.pool_size == 8
        with WorkerAgent(c.agent_config(job, 0)) as agent:
            assert agent.assignment.pool_size == agent.transport.config.pool_size == 8
            switch, udp = CountingSwitch(), agent.transport.channel
            agent.transport.channel = switch
            try:
                cells = np.arange(40 * CELLS_PER_PKT, dtype=np.int32)
                np.testing.assert_array_equal(agent.transport.allreduce(Op.ADD, cells), cells)
            finally:
                agent.transport.channel = udp
            assert switch.most_in_flight == 8
    finally:
        c.close()


def test_released_job_marks_the_agent_unhealthy_without_crashing(ctl):
    job = ctl.create(1, pool_size=4)
    with WorkerAgent(ctl.agent_config(job, 0)) as agent:
        assert agent.healthy
        ctl.client.release(job.job_id)
        wait_for(lambda: not agent.healthy, 5, "the agent to notice")
        assert "FAILED_PRECONDITION" in agent.unhealthy_reason
        failures = agent.heartbeat_failures
        wait_for(
            lambda: agent.heartbeat_failures > failures, 5, "the heartbeat thread to keep running"
        )
        assert not agent.healthy  # a job that ended does not come back
        assert "FAILED_PRECONDITION" in agent.peers_problem()  # proof: the peers are gone


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def test_an_unreachable_controller_is_no_evidence_that_the_peers_are_gone(ctl):
    """While heartbeats cannot reach the controller the agent is unhealthy (the hook keeps
    buckets off the switch) but a transport's wait goes on: only the controller's word that
    the job ended, or closing, says the peers are gone."""
    job = ctl.create(1, pool_size=4)
    with WorkerAgent(ctl.agent_config(job, 0)) as agent:
        real = agent.client

        class Down:
            def heartbeat(self, *args: object, **kw: object) -> None:
                raise _Unavailable()

            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

        agent.client = Down()
        wait_for(lambda: not agent.healthy, 5, "the agent to notice the controller is gone")
        assert "UNAVAILABLE" in agent.unhealthy_reason and agent.peers_problem() == ""
        assert agent.peers_unproven() == ""  # within a lease of the last answer
        # a lease and a heartbeat interval without an answer: nobody vouches for the peers
        asg = agent.assignment
        agent.proven_at -= asg.lease_s + asg.heartbeat_interval_s
        assert re.search(r"no heartbeat answered for \d.*UNAVAILABLE", agent.peers_unproven())
        agent.client = real
        wait_for(lambda: agent.healthy, 5, "heartbeats to be answered again")
        assert agent.peers_unproven() == ""
    assert agent.peers_problem() == "closed"


def test_a_give_up_reaches_the_other_ranks_within_a_heartbeat(ctl):
    """A rank's give-up goes out at once (not at its next heartbeat) and the others have it
    from their next heartbeat answer; a rank is not told its own, nor an older call's; its
    later heartbeats carry it again (a restarted controller learns it too)."""
    job = ctl.create(3, pool_size=4)
    agents = open_all(ctl, job, 3)
    try:
        interval = agents[0].assignment.heartbeat_interval_s
        start = time.monotonic()
        gave_up = GaveUp(0, 40, "the switch path is gone")
        agents[0].tell_peers(gave_up)
        wait_for(lambda: agents[1].peer_gave_up and agents[2].peer_gave_up, 5, "the others")
        took = time.monotonic() - start
        assert took <= interval + 0.5  # the others' next heartbeat, on a loaded machine
        assert agents[1].peer_gave_up == agents[2].peer_gave_up == gave_up
        agents[2].tell_peers(GaveUp(2, 12, "an older call"))
        time.sleep(3 * interval)
        assert agents[1].peer_gave_up == agents[2].peer_gave_up == gave_up
        assert agents[0].peer_gave_up is None
        job_of = ctl.server.manager.jobs[job.job_id]
        job_of.gave_up = None  # as after a controller restart: the heartbeats tell it again
        wait_for(lambda: job_of.gave_up == gave_up, 5, "rank 0's next heartbeat")
    finally:
        for a in agents:
            a.close()


def test_bad_token_is_a_clear_error(ctl):
    job = ctl.create(1)
    cfg = ctl.agent_config(job, 0, token="not-the-token")
    with pytest.raises(AgentError, match=r"JoinJob failed .*UNAUTHENTICATED") as info:
        WorkerAgent(cfg)
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    ctl.client.release(job.job_id)


def test_unreachable_controller_is_a_clear_error():
    cfg = AgentConfig(
        controller="127.0.0.1:1",
        job_id=1,
        token="x",
        rank=0,
        ip="127.0.0.1",
        udp_port=1,
        switch_port=1,
        mac="02:00:00:00:01:01",
        rpc_timeout=2.0,
        insecure=True,
    )
    agent, reason = open_agent(cfg)
    assert agent is None and ("UNAVAILABLE" in reason or "DEADLINE_EXCEEDED" in reason)


def test_missing_ranks_time_out_clearly(ctl):
    job = ctl.create(2)
    agent, reason = open_agent(ctl.agent_config(job, 0, ready_timeout=0.5))
    assert agent is None and "WaitReady failed" in reason and "DEADLINE_EXCEEDED" in reason
    ctl.client.release(job.job_id)


@needs_root
@needs_root
def test_agents_aggregate_through_the_switch(fab):
    job = fab.create(2, pool_size=8)
    agents = open_all(fab, job, 2)
    rng = np.random.default_rng(1)
    parts = [rng.integers(-(2**20), 2**20, 3000).astype(np.int32) for _ in range(2)]
    out: list = [None, None]
    try:
        threads = [
            threading.Thread(
                target=lambda r=r: out.__setitem__(
                    r, agents[r].transport.allreduce(Op.ADD, parts[r])
                )
            )
            for r in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    finally:
        for a in agents:
            a.close()
    for r in range(2):
        np.testing.assert_array_equal(out[r], parts[0] + parts[1])
