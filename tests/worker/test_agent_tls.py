"""End to end with a secured controller: agents verify its TLS certificate against the run's
CA, the job is created with an operator credential, and the ranks aggregate through the
switch; an agent that cannot verify the controller gets a clear reason, not a hang."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from homagg.api.client import ControllerClient
from homagg.control.pki import make_pki
from homagg.lab.controlled import Controlled
from homagg.lab.namespace import have_privileges
from homagg.wire.constants import Op
from homagg.worker.job.agent import WorkerAgent, open_agent

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    if not have_privileges():
        pytest.skip("needs root and iproute2 (network namespaces)")
    c = Controlled(tmp_path_factory.mktemp("agent-tls"), 2, fabric=True, tls=True)
    yield c
    c.close()


def test_agents_aggregate_through_a_tls_controller(secured):
    assert secured.ca_file is not None
    job = secured.create(2, pool_size=8)
    agents: list = [None, None]
    errors: list = []

    def join(r: int) -> None:
        try:
            agents[r] = WorkerAgent(secured.agent_config(job, r), secured.socket_factory(r))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    rng = np.random.default_rng(7)
    parts = [rng.integers(-(2**30), 2**30, 2000).astype(np.int32) for _ in range(2)]
    out: list = [None, None]
    try:
        assert not errors and all(agents), errors
        assert all(a.client.secure for a in agents)
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
        assert all(a.healthy for a in agents)
    finally:
        for a in agents:
            if a is not None:
                a.close()
    expected = (parts[0].astype(np.int64) + parts[1]).astype(np.int32)  # wraps like the switch
    for r in range(2):
        np.testing.assert_array_equal(out[r], expected)


def test_an_agent_that_cannot_verify_the_controller_gets_a_reason(secured, tmp_path):
    job = secured.create(1, pool_size=4)
    stranger = make_pki(tmp_path / "stranger", ["127.0.0.1"])
    cfg = secured.agent_config(job, 0, ca_file=stranger.ca, rpc_timeout=2.0, ready_timeout=3.0)
    agent, reason = open_agent(cfg, secured.socket_factory(0))
    assert agent is None and "UNAVAILABLE" in reason
    cfg = secured.agent_config(job, 0, ca_file=tmp_path / "missing.crt")
    agent, reason = open_agent(cfg, secured.socket_factory(0))
    assert agent is None and "cannot read the CA file" in reason
    anonymous = ControllerClient(secured.address, 2.0, secured.ca_file)
    with anonymous, pytest.raises(grpc.RpcError, match="operator credential"):
        anonymous.create_job("x", world_size=1, codec="lossless", pool_size=4)
