"""worker/attach.py's set-up in one process (gloo, world size 1) against an in-process
controller: every bad input is one clear reason (the hook then falls back), never a hang;
and the route to the controller gives this host's IP, interface and MAC."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch.distributed as dist
from agent_fabric import Controlled
from test_agent_assignment import GOOD

from testnet.switch_process import free_port
from worker import attach


@pytest.fixture(scope="module", autouse=True)
def gloo(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("ctl"), 2, fabric=False)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (attach.ENV_CONTROLLER, attach.ENV_JOB_ID, attach.ENV_TOKEN, attach.ENV_IFACE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(attach.ENV_TOKEN_FILE, raising=False)


def test_missing_controller_says_what_to_set():
    agent, reason = attach.connect()
    assert agent is None and "set HOMAGG_CONTROLLER" in reason


def test_unreachable_controller_fails_within_the_rpc_timeout():
    start = time.monotonic()
    agent, reason = attach.connect(controller=f"127.0.0.1:{free_port()}")
    assert agent is None and "CreateJob failed" in reason and "UNAVAILABLE" in reason
    assert time.monotonic() - start < 15


def test_world_above_the_data_plane_limit(monkeypatch, controlled):
    monkeypatch.setattr(attach, "MAX_WORKERS_PER_JOB", 0)
    agent, reason = attach.connect(controller=controlled.address)
    assert agent is None and "world size 1 is above the 0 workers" in reason


def test_refused_token_from_the_launcher(monkeypatch, controlled, tmp_path):
    job = controlled.create(1)
    token_file = tmp_path / "token"
    token_file.write_text("not-the-token\n")
    monkeypatch.setenv(attach.ENV_JOB_ID, str(job.job_id))
    monkeypatch.setenv(attach.ENV_TOKEN_FILE, str(token_file))
    monkeypatch.setenv(attach.ENV_IFACE, "lo")
    agent, reason = attach.connect(controller=controlled.address)
    assert agent is None and "JoinJob failed" in reason and "UNAUTHENTICATED" in reason
    assert "not-the-token" not in reason


def test_host_outside_the_topology_is_told_to_name_its_port(controlled):
    agent, reason = attach.connect(controller=controlled.address)  # 127.0.0.1 on lo
    assert agent is None and "127.0.0.1 is not a host of any configured switch" in reason
    jobs = controlled.client.list_jobs(include_ended=True).jobs
    assert jobs  # rank 0 created it; released at exit, or ended by the join timeout


def test_lane_codecs_are_refused_when_the_switchs_program_has_no_lanes(monkeypatch, controlled):
    """The assignment says whether the switch adds 16/8-bit lanes (the TNA program does
    not): a lane codec is refused up front, with its agent closed, instead of losing its
    packets as BAD_OP; the other codecs, and lane codecs on a v1model switch, keep it."""
    closed: list[str] = []

    class Agent:
        def __init__(self, lane_ops: bool) -> None:
            self.assignment = dataclasses.replace(GOOD, lane_ops=lane_ops)

        def joined(self):
            return self.assignment, None

        def close(self) -> None:
            closed.append(self.assignment.switch)

    monkeypatch.setenv(attach.ENV_IFACE, "lo")
    for codec, lanes, refused in [
        ("lowbit8", False, True),
        ("lowbit16", False, True),
        ("fixed_point", False, False),
        ("lowbit8", True, False),
    ]:
        closed.clear()
        monkeypatch.setattr(attach, "open_agent", lambda cfg, lanes=lanes: (Agent(lanes), ""))
        closers: list = []
        agent, reason = attach.connect(codec, controller=controlled.address, closers=closers)
        closers[0]()  # release the job now (else at exit)
        if refused:
            assert agent is None and closed == ["s1"]  # closed once, by connect
            assert f"codec {codec} adds 16/8-bit lanes" in reason and "TNA" in reason
        else:
            assert agent is not None and reason == "" and closed == ["s1"]  # by the closer


def test_route_and_ticket():
    route = attach.route_to("127.0.0.1:50051")
    assert (route.ip, route.iface) == ("127.0.0.1", "lo") and route.mac.count(":") == 5
    with pytest.raises(attach.AgentError, match="has no IPv4 address"):
        attach.route_of("no-such-if0")
    assert "secret" not in repr(attach.JobTicket(3, "secret", True))
