"""homagg/worker/ddp/attach.py's set-up in one process (gloo, world size 1) against an in-process
controller: every bad input is one clear reason (the hook then falls back) or one clear
error, never a hang; the route to the controller gives this host's IP, interface and MAC;
nothing prints the token; releasing a job that already ended counts as released."""

from __future__ import annotations

import dataclasses
import time
import urllib.request

import grpc
import pytest
import torch.distributed as dist
from test_agent_assignment import GOOD

from homagg.api.client import release_job
from homagg.environment import (
    ATTACH_ENV,
    CA_FILE_ENV,
    CODEC_ENV,
    CONTROLLER_ENV,
    IFACE_ENV,
    INSECURE_ENV,
    JOB_ID_ENV,
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    METRICS_ADDRESS_ENV,
    METRICS_PORT_ENV,
    READY_TIMEOUT_ENV,
)
from homagg.lab.controlled import Controlled
from homagg.lab.switch_process import free_port
from homagg.worker.ddp import attach
from homagg.worker.job import session as job_session
from homagg.worker.job import setup as job_setup
from homagg.worker.job.agent import AgentConfig, AgentError
from homagg.worker.job.route import route_of, route_to


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
    for name in (
        CONTROLLER_ENV,
        JOB_ID_ENV,
        JOB_TOKEN_ENV,
        JOB_TOKEN_FILE_ENV,
        IFACE_ENV,
        CODEC_ENV,
        READY_TIMEOUT_ENV,
        CA_FILE_ENV,
        METRICS_PORT_ENV,
        METRICS_ADDRESS_ENV,
        ATTACH_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the test controller serves plaintext


def fallback(**kw) -> str:
    """The reason attach falls back for (asserting its one warning and no agent)."""
    with pytest.warns(RuntimeWarning, match="falls back to the process group") as caught:
        state = attach.attach(None, **kw)
    assert len(caught) == 1 and state.agent is None and state.warned
    assert not job_session._sessions  # a failed set-up holds nothing
    return state.unavailable_reason


def test_missing_controller_says_what_to_set():
    assert "set HOMAGG_CONTROLLER" in fallback()


def test_plaintext_is_never_a_silent_fallback(monkeypatch, controlled):
    """Without a CA and without HOMAGG_INSECURE=1 no rank sends a token: every rank falls
    back with a reason that says what to set, and no job is created."""
    monkeypatch.delenv(INSECURE_ENV)
    before = len(controlled.client.list_jobs(include_ended=True).jobs)
    reason = fallback(controller=controlled.address)
    assert f"no CA to verify the controller at {controlled.address}" in reason
    assert CA_FILE_ENV in reason and f"{INSECURE_ENV}=1" in reason
    assert len(controlled.client.list_jobs(include_ended=True).jobs) == before
    monkeypatch.setenv(INSECURE_ENV, "yes")
    assert f"{INSECURE_ENV}='yes': set it to 1" in fallback(controller=controlled.address)


def test_attach_off_sets_nothing_up_and_registers_nothing(monkeypatch, controlled, recwarn):
    """HOMAGG_ATTACH=0: the same script over its process group, as without the two lines:
    no controller contacted, no collective, no hook, no warning; a bad value is an error."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def no_setup(*args, **kwargs):
        raise AssertionError("set_up ran")

    monkeypatch.setattr(attach, "set_up", no_setup)
    monkeypatch.setenv(ATTACH_ENV, "0")
    model = DDP(torch.nn.Linear(2, 1))
    registered = []
    monkeypatch.setattr(model, "register_comm_hook", lambda *a: registered.append(a))
    state = attach.attach(model, controller=controlled.address)
    assert state.agent is None and state.unavailable_reason == f"{ATTACH_ENV}=0"
    assert registered == [] and not recwarn.list
    monkeypatch.setenv(ATTACH_ENV, "off")
    with pytest.raises(ValueError, match=f"{ATTACH_ENV}='off': expected 0"):
        attach.attach(model)


def test_unreachable_controller_fails_within_the_rpc_timeout():
    start = time.monotonic()
    reason = fallback(controller=f"127.0.0.1:{free_port()}")
    assert "CreateJob failed" in reason and "UNAVAILABLE" in reason
    assert time.monotonic() - start < 15


def test_world_above_the_data_plane_limit(monkeypatch, controlled):
    monkeypatch.setattr(job_setup, "MAX_RANKS", 0)
    assert "world size 1 is above the 0 ranks" in fallback(controller=controlled.address)


def test_refused_token_from_the_launcher(monkeypatch, controlled, tmp_path):
    job = controlled.create(1)
    token_file = tmp_path / "token"
    token_file.write_text("not-the-token\n")
    monkeypatch.setenv(JOB_ID_ENV, str(job.job_id))
    monkeypatch.setenv(JOB_TOKEN_FILE_ENV, str(token_file))
    monkeypatch.setenv(IFACE_ENV, "lo")
    reason = fallback(controller=controlled.address)
    assert "JoinJob failed" in reason and "UNAUTHENTICATED" in reason
    assert "not-the-token" not in reason


def test_host_outside_the_topology_is_told_to_name_its_port(controlled):
    reason = fallback(controller=controlled.address)  # 127.0.0.1 on lo
    assert "127.0.0.1 is not a host of any configured switch" in reason
    jobs = controlled.client.list_jobs(include_ended=True).jobs
    [job] = [j for j in jobs if j.name == "torchrun"]
    assert job.state == "ended"  # rank 0 created it and released it when the set-up failed


def test_a_bad_ready_timeout_is_a_reason(monkeypatch, controlled):
    monkeypatch.setenv(READY_TIMEOUT_ENV, "soon")
    assert "HOMAGG_READY_TIMEOUT='soon' is not a positive number" in fallback(
        controller=controlled.address
    )


def test_an_unknown_codec_is_an_error(monkeypatch):
    monkeypatch.setenv(CODEC_ENV, "nope")
    with pytest.raises(
        ValueError,
        match=r"HOMAGG_CODEC on rank 0: unknown codec 'nope'; expected one of lossless, .*auto",
    ):
        attach.attach(None)
    with pytest.raises(ValueError, match="codec= on rank 0: unknown codec 'zip'"):
        attach.attach(None, "zip")


def test_auto_options_set_the_controller_and_bad_ones_are_errors():
    """auto_options are the controller's settings: an unknown one is an error before any
    job exists (the list of the known ones in it), and they need codec "auto"."""
    with pytest.raises(ValueError, match=r"codec 'auto' has no option bogus; its options: .*lag"):
        attach.attach(None, "auto", auto_options={"bogus": 1})
    with pytest.raises(ValueError, match="lag is 0"):
        attach.attach(None, "auto", auto_options={"lag": 3})
    assert not job_session._sessions
    with pytest.warns(RuntimeWarning, match="falls back"):  # no controller: the host path
        state = attach.attach(None, "auto", auto_options={"lag": 0, "min_density": 0.25})
    assert state.controller is not None and state.controller.config.lag == 0
    assert state.controller.config.min_density == 0.25
    wrong = "auto_options apply to codec 'auto', not 'lossless'"
    with pytest.raises(ValueError, match=wrong), pytest.warns(RuntimeWarning, match="falls back"):
        attach.attach(None, "lossless", auto_options={"lag": 0})


def test_metrics_port_serves_the_hook_stats_and_a_bad_one_fails_before_the_job(monkeypatch):
    """attach(metrics_port=...) serves even a fallen-back state's stats (job "none"); a bad
    port, argument or environment, is an error before anything is set up."""
    with pytest.raises(ValueError, match="metrics_port=65536"):
        attach.attach(None, metrics_port=65536)
    monkeypatch.setenv(METRICS_PORT_ENV, "next")
    with pytest.raises(ValueError, match="HOMAGG_METRICS_PORT='next'"):
        attach.attach(None)
    assert not job_session._sessions
    monkeypatch.setenv(METRICS_PORT_ENV, "0")  # any free port
    with pytest.warns(RuntimeWarning, match="falls back"):
        state = attach.attach(None)
    try:
        assert state.metrics is not None and state.metrics.address == "127.0.0.1"
        with urllib.request.urlopen(state.metrics.url, timeout=5) as answer:
            text = answer.read().decode()
        assert 'homagg_worker_buckets_total{job="none",path="fallback"} 0.0' in text
    finally:
        state.metrics.close()


def test_lane_codecs_are_refused_when_the_switchs_program_has_no_lanes(monkeypatch, controlled):
    """The assignment says whether the switch adds 16/8-bit lanes (the TNA program does
    not): the set-up refuses a lane codec up front (one reason, the agent closed, the job
    released) instead of losing its packets as BAD_OP; the other codecs, and lane codecs
    on a v1model switch, keep the agent."""
    closed: list[str] = []

    class Agent:
        def __init__(self, codec: str, lane_ops: bool) -> None:
            self.assignment = dataclasses.replace(GOOD, codec=codec, lane_ops=lane_ops)

        def close(self) -> None:
            closed.append(self.assignment.switch)

    monkeypatch.setenv(IFACE_ENV, "lo")
    for codec, lanes, refused in [
        ("lowbit8", False, True),
        ("lowbit16", False, True),
        ("fixed_point", False, False),
        ("lowbit8", True, False),
    ]:
        closed.clear()
        monkeypatch.setattr(
            job_setup, "open_agent", lambda cfg, c=codec, lanes=lanes: (Agent(c, lanes), "")
        )
        if refused:
            reason = fallback(codec=codec, controller=controlled.address)
            assert closed == ["s1"]  # closed once, by the failed set-up
            assert f"codec {codec} adds 16/8-bit lanes" in reason and "TNA" in reason
            assert "switch s1" in reason
        else:
            request = job_setup.Request(codec=codec, controller=controlled.address)
            setup = job_setup.set_up(request, job_setup.group_members(None))
            assert setup.agent is not None and setup.reason == "" and setup.codec == codec
            assert setup.session is not None and closed == []
            setup.session.close("the test is done")  # leaves and releases the job
            assert closed == ["s1"]
    jobs = controlled.client.list_jobs(include_ended=True).jobs
    assert all(j.state == "ended" for j in jobs if j.codec.startswith("lowbit"))


def test_route_ticket_and_config_keep_the_token_out():
    route = route_to("127.0.0.1:50051")
    assert (route.ip, route.iface) == ("127.0.0.1", "lo") and route.mac.count(":") == 5
    with pytest.raises(AgentError, match="has no IPv4 address"):
        route_of("no-such-if0")
    assert "secret" not in repr(job_setup.JobTicket(3, "secret", True))
    cfg = AgentConfig(controller="x:1", job_id=1, token="secret", rank=0, ip="1.2.3.4", udp_port=1)
    assert "secret" not in repr(cfg) and "secret" not in str(cfg)


def test_release_counts_an_ended_job_as_released(controlled):
    job = controlled.create(1)
    assert release_job(controlled.client.release, job.job_id) == ""
    assert release_job(controlled.client.release, job.job_id) == ""  # ended
    assert release_job(controlled.client.release, 4000).startswith("NOT_FOUND")

    def refuses(job_id: int) -> None:
        raise grpc.RpcError("boom")

    assert "boom" in release_job(refuses, 1)


def test_destroy_process_group_is_wrapped_once():
    job_session._install_destroy_hook()
    wrapped = dist.destroy_process_group
    job_session._install_destroy_hook()
    assert dist.destroy_process_group is wrapped and wrapped._homagg
    assert dist.distributed_c10d.destroy_process_group is wrapped
