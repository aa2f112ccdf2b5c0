"""A link that goes down under a rank: its next send fails locally (ENETUNREACH), which is
the switch path failing at this host. The transport's error names the errno, and the DDP
hook falls back with "the switch path failed" and that cause, not "an unexpected error".

The link is a real one: the rank's veth in its host namespace, set down or stripped of its
address while the job runs. The error is raised by the rank's own kernel before any packet
leaves, so the reference switch stands for both targets."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_agent import open_all
from test_ddp_hook import Bucket

from homagg.lab.controlled import Controlled
from homagg.lab.namespace import have_privileges, ip
from homagg.lab.threads import run_threads
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook
from homagg.worker.transport.switch_transport import TransportError

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
CELLS = np.arange(4 * CELLS_PER_PKT, dtype=np.int32)
CAUSE = r"ENETUNREACH: Network is unreachable"


@pytest.fixture(scope="module")
def fab(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("link"), 2, fabric=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """A one-rank process group: the hook's agreement and fallback of rank 0 alone."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def set_link(fab: Controlled, rank: int, how: str, up: bool) -> None:
    """Rank's link to the switch fails (up=False) or comes back: its interface set down, or
    its address removed (either takes the route to the switch's service address with it)."""
    assert fab.fabric is not None
    host = fab.fabric.hosts[rank]
    if how == "link down":
        ip("link", "set", "dev", host.iface, "up" if up else "down", netns=host.namespace)
    else:
        verb = "replace" if up else "del"
        ip("addr", verb, f"{host.ip}/24", "dev", host.iface, netns=host.namespace)


@pytest.mark.parametrize("how", ["link down", "address removed"])
def test_a_send_on_a_failed_link_names_its_errno(fab, how):
    job = fab.create(2, pool_size=4)
    agents = open_all(fab, job, 2)
    try:
        transport = agents[0].transport
        steps = [lambda r=r: agents[r].transport.allreduce(Op.ADD, CELLS) for r in range(2)]
        run_threads(steps, 30)  # the link works
        set_link(fab, 0, how, up=False)
        start = time.monotonic()
        with pytest.raises(TransportError, match=rf"\({CAUSE}\): the switch path failed"):
            transport.allreduce(Op.ADD, CELLS)
        assert time.monotonic() - start < 1.0  # at the first send, not after a budget
    finally:
        set_link(fab, 0, how, up=True)
        for a in agents:
            a.close()


@pytest.mark.usefixtures("gloo")
def test_the_hook_falls_back_with_the_cause(fab):
    job = fab.create(2, pool_size=4)
    agents = open_all(fab, job, 2)
    try:
        state = SwitchHookState(agents[0], codec="lossless", world_size=1, rank=0)
        set_link(fab, 0, "link down", up=False)
        grad = torch.linspace(-1.0, 1.0, 3000)
        with pytest.warns(RuntimeWarning, match=rf"the switch path failed .*{CAUSE}") as warned:
            out = switch_allreduce_hook(state, Bucket(grad.clone())).wait()
        torch.testing.assert_close(out, grad)  # the fallback's all_reduce of one rank
        assert "unexpected" not in str(warned[0].message)
        assert state.stats.fallback_reasons == {"the switch path failed (TransportError)": 1}
    finally:
        set_link(fab, 0, "link down", up=True)
        for a in agents:
            a.close()
