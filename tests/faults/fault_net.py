"""Helpers of the fault tests: a fabric (switch process, hosts in namespaces) managed by a
controller (in-process, or `aggctl serve` as a killable process), worker agents on its
hosts, lock-step rounds over the agents' transports, and a switch restarted on its port."""

from __future__ import annotations

import socket
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from homagg.api.client import ControllerClient
from homagg.control.service import ControllerServer
from homagg.control.switch_connection import SwitchConnection
from homagg.lab import threads
from homagg.lab.controller_process import ControllerProcess, write_toml  # noqa: F401 (re-exported)
from homagg.lab.fabric import SERVICE_IP, SWITCH_MAC, Fabric
from homagg.lab.namespace import have_privileges, in_namespace
from homagg.lab.poll import wait_for
from homagg.lab.switch_process import bmv2_available, ebpf_problem
from homagg.wire.constants import WORKER_UDP_BASE
from homagg.worker.job.agent import AgentConfig, WorkerAgent

UDP_BASE = WORKER_UDP_BASE
TIMING = {"heartbeat_interval": 0.2, "lease": 3.0, "join_timeout": 30.0}
NEEDS_ROOT = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
TARGETS = [
    pytest.param("refswitch", id="refswitch"),
    pytest.param(
        "bmv2",
        id="bmv2",
        marks=pytest.mark.skipif(
            not bmv2_available(), reason="simple_switch_grpc is not installed (see docs/bmv2.md)"
        ),
    ),
    pytest.param(
        "ebpf",
        id="ebpf",
        marks=pytest.mark.skipif(bool(ebpf_problem()), reason=f"eBPF target: {ebpf_problem()}"),
    ),
]


def host_dicts(fabric: Fabric) -> list[dict[str, Any]]:
    return [{"ip": h.ip, "mac": h.mac, "switch_port": h.switch_port} for h in fabric.hosts]


def config_doc(fabric: Fabric, tmp: Path, listen: str = "127.0.0.1:0", **timing: Any) -> dict:
    """A controller configuration for the fabric's switch as s1 with its hosts."""
    return {
        "controller": {
            "listen": listen,
            "database": str(tmp / "controller.db"),
            **TIMING,
            **timing,
        },
        "switch": [
            {
                "name": "s1",
                "address": fabric.switch.address,
                "mac": SWITCH_MAC,
                "service_ip": SERVICE_IP,
                "timeout": 2.0,
                "hosts": host_dicts(fabric),
            }
        ],
    }


def make_fabric(target: str, n: int, tmp: Path) -> Fabric:
    """A fabric whose hosts have their IP stack on, the controller to become its primary."""
    fabric = Fabric(target, n, tmp)
    try:
        for h in fabric.hosts:
            h.enable_ip_stack()
        fabric.release_connection()
    except BaseException:
        fabric.close()
        raise
    return fabric


def synced(client: ControllerClient) -> bool:
    try:
        return all(s.connected for s in client.status().switches)
    except Exception:
        return False


class InProcessController:
    """ControllerServer in this process, with fast reconnection."""

    def __init__(self, doc: dict, tmp: Path) -> None:
        from homagg.control.config import parse_config

        self.server = ControllerServer(parse_config(doc, tmp), poll_interval=0.05, max_backoff=0.3)
        self.address = f"127.0.0.1:{self.server.start()}"
        self.client = ControllerClient(self.address, timeout=5.0, insecure=True)
        wait_for(lambda: synced(self.client), 20, "the controller to sync its switch")

    def stop(self) -> None:
        self.client.close()
        self.server.stop(0)


def agent_config(
    address: str, fabric: Fabric, job: Any, rank: int, host: int | None = None, **kw: Any
) -> AgentConfig:
    """Rank `rank` on fabric host `host` (default: host `rank`)."""
    h = fabric.hosts[rank if host is None else host]
    fields = dict(
        controller=address,
        job_id=job.job_id,
        token=job.token,
        rank=rank,
        ip=h.ip,
        udp_port=UDP_BASE + rank,
        switch_port=h.switch_port,
        mac=h.mac,
        ready_timeout=20.0,
        rpc_timeout=2.0,
        insecure=True,  # the fault tests' controllers serve plaintext on loopback
    )
    fields.update(kw)
    return AgentConfig(**fields)


def socket_factory(namespace: str) -> Callable[[], socket.socket]:
    def make() -> socket.socket:
        with in_namespace(namespace):
            return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    return make


def run_threads(work: Callable[[int], Any], n: int, timeout: float) -> list[Any]:
    """work(i) in n daemon threads; returns each result or the exception it raised.
    RuntimeError if any thread is still running after `timeout` (a hang)."""
    return threads.run_threads([partial(work, i) for i in range(n)], timeout, return_errors=True)[1]


def open_agents(address: str, fabric: Fabric, job: Any, world: int, **kw: Any) -> list[WorkerAgent]:
    """One agent per rank, opened concurrently (WaitReady blocks until all joined)."""
    got = run_threads(
        lambda r: WorkerAgent(
            agent_config(address, fabric, job, r, **kw), socket_factory(fabric.hosts[r].namespace)
        ),
        world,
        40,
    )
    errors = [g for g in got if isinstance(g, BaseException)]
    if errors:
        for g in got:
            if not isinstance(g, BaseException):
                g.close()
        raise errors[0]
    return got


def round_parts(seed: int, world: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-(2**28), 2**28, n).astype(np.int32) for _ in range(world)]


def expected_sum(parts: list[np.ndarray]) -> np.ndarray:
    return np.sum(parts, axis=0, dtype=np.int64).astype(np.int32)


def backup_reader(address: str) -> SwitchConnection:
    """A backup P4Runtime session (reads only) to a switch the controller is primary of."""
    conn = SwitchConnection(address, election_id=2, timeout=3.0)
    conn.connect(require_primary=False)
    return conn
