"""The agent refuses an assignment it cannot work with, with a clear reason: open_agent
returns (None, reason) and nothing is left open. A fake controller sends the assignment."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from homagg.api import jobs_pb2, jobs_pb2_grpc
from homagg.api.assignment import Assignment
from homagg.lab.controlled import free_port_udp
from homagg.wire.constants import CELLS_PER_PKT
from homagg.worker.job.agent import AgentConfig, open_agent
from homagg.worker.transport.switch_transport import TransportConfig

GOOD = Assignment(
    job_id=7,
    rank=1,
    world_size=2,
    switch="s1",
    service_ip="10.0.0.254",
    udp_port=40700,
    switch_mac="02:00:00:00:00:fe",
    pool_size=16,
    cells_per_packet=CELLS_PER_PKT,
    codec="lossless",
    heartbeat_interval_s=0.5,
    lease_s=3.0,
)


class FakeController(jobs_pb2_grpc.ControllerServicer):
    """Answers JoinJob, WaitReady (with `assignment`, after `busy` RESOURCE_EXHAUSTED
    answers), Heartbeat and LeaveJob."""

    def __init__(self) -> None:
        self.assignment = GOOD
        self.busy = 0
        self.waits = 0

    def JoinJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return jobs_pb2.JoinJobResponse(joined=2, world_size=2, ready=True)

    def WaitReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.waits += 1
        if self.waits <= self.busy:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many WaitReady calls")
        return jobs_pb2.Assignment(**dataclasses.asdict(self.assignment))

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        return jobs_pb2.HeartbeatResponse(state="ready", lease_s=3.0)

    def LeaveJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return jobs_pb2.LeaveJobResponse(job_ended=False)


@pytest.fixture
def fake() -> Iterator[tuple[FakeController, str]]:
    servicer = FakeController()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    jobs_pb2_grpc.add_ControllerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def _config(address: str) -> AgentConfig:
    return AgentConfig(
        controller=address,
        job_id=7,
        token="t",
        rank=1,
        ip="127.0.0.1",
        udp_port=free_port_udp(),
        switch_port=1,
        mac="02:00:00:00:01:02",
        ready_timeout=5.0,
        rpc_timeout=2.0,
        insecure=True,
    )


def test_a_good_assignment_is_accepted(fake):
    _, address = fake
    agent, reason = open_agent(_config(address))
    assert agent is not None and reason == ""
    assert agent.assignment == GOOD and agent.healthy
    agent.close()


TIMING = {
    "initial_timeout": 0.03,
    "max_timeout": 0.7,
    "min_timeout": 0.002,
    "adaptive_timeout": False,
    "max_retries": 5,
    "dead_path_s": 1.5,
    "max_straggler_wait": 40.0,
}


def test_the_transport_takes_the_agents_timing(fake):
    """Every retransmission and straggler setting of AgentConfig reaches the transport;
    the defaults are the transport's own."""
    _, address = fake
    defaults = TransportConfig(job_id=7, rank=1, world_size=2, pool_size=16)
    for timing in ({}, TIMING):
        agent, reason = open_agent(dataclasses.replace(_config(address), **timing))
        assert agent is not None, reason
        try:
            _, transport = agent.joined()
            want = dataclasses.replace(defaults, **timing)
            assert transport.config == want
            assert (transport.wait.dead_path_s, transport.wait.max_wait) == (
                want.dead_path_s,
                want.max_straggler_wait,
            )
            assert transport.timer.adaptive == want.adaptive_timeout
        finally:
            agent.close()


def test_the_transport_takes_the_switchs_cells_per_packet(fake):
    """A job on a switch whose program takes 64 cells (a Tofino switch): the transport
    packs 64, whatever this worker's default build is."""
    servicer, address = fake
    servicer.assignment = dataclasses.replace(GOOD, cells_per_packet=64, lane_ops=False)
    agent, reason = open_agent(_config(address))
    assert agent is not None, reason
    try:
        _, transport = agent.joined()
        assert (transport.config.cells_per_packet, transport.config.lane_ops) == (64, False)
        assert transport.config.frame_bytes == 14 + 20 + 8 + 16 + 4 * 64
    finally:
        agent.close()


BAD = [
    ({"pool_size": 0}, "pool_size 0 outside 1..4096"),
    ({"pool_size": 5000}, "pool_size 5000 outside"),
    ({"heartbeat_interval_s": 1e9}, "more than half the lease"),
    ({"heartbeat_interval_s": 0.0}, "heartbeat_interval_s 0.0 is not a positive number"),
    ({"heartbeat_interval_s": float("nan")}, "not a positive number"),
    ({"lease_s": float("inf")}, "lease_s inf outside"),
    ({"world_size": 0}, "world_size 0 outside 1..256"),
    ({"world_size": 257}, "world_size 257 outside"),
    ({"rank": 2}, "rank 2 (world size 2), but this worker is rank 1"),
    ({"rank": 0}, "but this worker is rank 1"),
    ({"job_id": 8}, "job_id 8, but this worker joined job 7"),
    ({"service_ip": "not-an-ip"}, "service_ip 'not-an-ip' is not an IPv4 address"),
    ({"service_ip": "224.0.0.1"}, "not a unicast address"),
    ({"service_ip": "0.0.0.0"}, "not a unicast address"),
    ({"udp_port": 0}, "udp_port 0 outside 1..65535"),
    ({"cells_per_packet": 0}, "cells_per_packet 0 is none of (16, 32, 48, 64, 128, 256)"),
    ({"cells_per_packet": 100}, "homagg.wire.constants.CELLS_CHOICES"),
]


@pytest.mark.parametrize(("change", "reason"), BAD, ids=[str(c) for c, _ in BAD])
def test_unusable_assignments_are_refused(fake, change, reason):
    servicer, address = fake
    servicer.assignment = dataclasses.replace(GOOD, **change)
    agent, why = open_agent(_config(address))
    assert agent is None
    assert "unusable assignment" in why and reason in why, why


def test_wait_ready_is_retried_while_the_controller_is_busy(fake):
    servicer, address = fake
    servicer.busy = 2
    agent, reason = open_agent(_config(address))
    assert agent is not None, reason
    assert servicer.waits == 3
    agent.close()
