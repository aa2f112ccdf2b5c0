"""A controller in this process over a switch, for the tests and benchmarks of agents, hooks
and training: it manages either a port-less in-process reference switch (control plane
only, no privileges) or a fabric's switch with hosts in namespaces (data plane), and makes
agent configurations and rank environments for its hosts."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from homagg.api.client import ControllerClient
from homagg.api.credentials import ADMIN, Operator, hash_token
from homagg.control.config import ControllerConfig, parse_config
from homagg.control.pki import make_pki
from homagg.control.service import ControllerServer
from homagg.environment import CA_FILE_ENV, IFACE_ENV, INSECURE_ENV
from homagg.lab.addresses import host_entry
from homagg.lab.fabric import SERVICE_IP, SWITCH_MAC, Fabric
from homagg.lab.namespace import in_namespace
from homagg.lab.poll import wait_for
from homagg.lab.switch_process import free_port
from homagg.refswitch.switch import ReferenceSwitch
from homagg.wire.constants import WORKER_UDP_BASE
from homagg.worker.job.agent import AgentConfig

TIMING = {"heartbeat_interval": 0.2, "lease": 3.0, "join_timeout": 60.0}
UDP_BASE = WORKER_UDP_BASE
OPERATOR_TOKEN = "-operator-token-of-the-tls-tests"  # a leading '-' on purpose


def hosts(n: int) -> list[dict[str, Any]]:
    """The fabric's hosts (homagg.lab.addresses), as the controller's configuration lists them."""
    return [host_entry(i) for i in range(n)]


def controller_config(
    switch_address: str, tmp_path: Path, n: int, **switch_keys: Any
) -> ControllerConfig:
    """One switch s1 with n hosts (and `switch_keys`, e.g. max_pool_size), short heartbeats."""
    doc = {
        "controller": {
            "listen": "127.0.0.1:0",
            "database": str(tmp_path / "controller.db"),
            **TIMING,
        },
        "switch": [
            {
                "name": "s1",
                "address": switch_address,
                "mac": SWITCH_MAC,
                "service_ip": SERVICE_IP,
                "timeout": 1.0,
                "hosts": hosts(n),
                **switch_keys,
            }
        ],
    }
    return parse_config(doc, tmp_path)


def free_port_udp() -> int:
    """A UDP port on 127.0.0.1 that nobody uses right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controlled:
    """An in-process controller over one switch; `fabric` is set for data-plane setups."""

    def __init__(
        self,
        tmp_path: Path,
        n: int,
        fabric: bool,
        listen: str = "",
        tls: bool = False,
        target: str = "refswitch",
        **switch_keys: Any,
    ) -> None:
        """listen "unix:PATH" serves on a Unix socket, reachable from every namespace; `tls`
        serves TLS (a fresh CA in tmp_path/pki) and requires OPERATOR_TOKEN for operator calls;
        target "bmv2" runs the fabric's switch on BMv2; `switch_keys` go to its [[switch]]."""
        self.ca_file: Path | None = None
        self.fabric: Fabric | None = None
        self.refswitch: ReferenceSwitch | None = None
        self.server: ControllerServer | None = None
        try:
            if fabric:
                self.fabric = Fabric(target, n, tmp_path)
                for h in self.fabric.hosts:
                    h.enable_ip_stack()
                self.fabric.conn.close()  # the controller becomes the primary
                self.fabric.conn = None
                address = self.fabric.switch.address
            else:
                address = f"127.0.0.1:{free_port()}"
                self.refswitch = ReferenceSwitch({}, address)
                self.refswitch.start()
            config = controller_config(address, tmp_path, n, **switch_keys)
            if listen:
                config = dataclasses.replace(config, listen=listen)
            if tls:
                pki = make_pki(tmp_path / "pki", ["127.0.0.1"])
                self.ca_file = pki.ca
                operator = Operator("test", hash_token(OPERATOR_TOKEN), role=ADMIN)
                config = dataclasses.replace(
                    config, tls_cert=pki.cert, tls_key=pki.key, operators=(operator,)
                )
            self.server = ControllerServer(config, poll_interval=0.05, max_backoff=0.3)
            port = self.server.start()
            self.address = listen or f"127.0.0.1:{port}"
            self.client = ControllerClient(
                self.address,
                5.0,
                self.ca_file,
                OPERATOR_TOKEN if tls else None,
                insecure=self.ca_file is None,
            )
            wait_for(
                lambda: all(s.connected for s in self.client.status().switches),
                15,
                "the switch to sync",
            )
        except BaseException:
            self.close()
            raise

    def create(self, world: int, codec: str = "lossless", pool_size: int = 16) -> Any:
        """A new job."""
        return self.client.create_job("t", world_size=world, codec=codec, pool_size=pool_size)

    def agent_config(self, job: Any, rank: int, **kw: Any) -> AgentConfig:
        """Rank `rank` on host `rank` of the fabric."""
        h = hosts(rank + 1)[rank]
        fields = dict(
            controller=self.address,
            job_id=job.job_id,
            token=job.token,
            rank=rank,
            ip=h["ip"],
            udp_port=UDP_BASE + rank,
            switch_port=h["switch_port"],
            mac=h["mac"],
            ready_timeout=15.0,
            ca_file=self.ca_file,
            insecure=self.ca_file is None,
        )
        if self.fabric is None:  # no namespaces: a loopback socket (the data plane is not used)
            fields.update(ip="127.0.0.1", udp_port=free_port_udp())
        fields.update(kw)
        return AgentConfig(**fields)

    def socket_factory(self, rank: int) -> Callable[[], socket.socket]:
        """Makes rank's UDP socket inside its host namespace (fabric) or here."""
        ns = self.fabric.hosts[rank].namespace if self.fabric is not None else None

        def make() -> socket.socket:
            if ns is None:
                return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with in_namespace(ns):
                return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

        return make

    def close(self) -> None:
        """Stop the controller and the switch, remove the fabric."""
        if self.server is not None:
            self.client.close()
            self.server.stop(0)
        if self.refswitch is not None:
            self.refswitch.close()
        if self.fabric is not None:
            self.fabric.close()


ROOT = Path(__file__).resolve().parents[2]


def rank_env(c: Controlled, rank: int, world: int, port: int, **homagg: str) -> dict[str, str]:
    """What torchrun gives `rank` of a job on the fabric's hosts (rank 0's host is the
    master), its host's interface for gloo and the agent, the controller's CA (or
    HOMAGG_INSECURE=1 without TLS), plus HOMAGG_* variables given as keywords
    (controller="..." is HOMAGG_CONTROLLER; an empty value is left out)."""
    assert c.fabric is not None
    host = c.fabric.hosts[rank]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": c.fabric.hosts[0].ip,
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": host.iface,
        IFACE_ENV: host.iface,  # the controller is on a Unix socket, not routed
        "OMP_NUM_THREADS": "1",
    }
    # the controller's CA, or plaintext chosen (a test controller without TLS)
    env.update({CA_FILE_ENV: str(c.ca_file)} if c.ca_file else {INSECURE_ENV: "1"})
    env.update({f"HOMAGG_{k.upper()}": v for k, v in homagg.items()})
    return {k: v for k, v in env.items() if v}


def run_in_hosts(
    c: Controlled,
    argvs: list[list[str]],
    envs: list[dict[str, str]],
    logs: list[Path],
    timeout: float,
    hosts: list[int] | None = None,
    check: bool = True,
) -> list[str]:
    """Rank i's argv run in host i's namespace (hosts[i]'s when given: several jobs on the
    same hosts) with envs[i], its output in logs[i]; all waited for within `timeout` s (the
    late ones killed); asserts every rank exited 0 (unless not `check`) and returns their
    logs."""
    return run_in_hosts_timed(c, argvs, envs, logs, timeout, hosts, check)[0]


def run_in_hosts_timed(
    c: Controlled,
    argvs: list[list[str]],
    envs: list[dict[str, str]],
    logs: list[Path],
    timeout: float,
    hosts: list[int] | None = None,
    check: bool = True,
) -> tuple[list[str], list[float]]:
    """run_in_hosts, and the seconds each rank ran (to 0.05 s): tests that bound one job's
    time by another's started with it on the same hosts, which load slows alike."""
    assert c.fabric is not None
    procs = []
    start = time.monotonic()
    for i, (argv, env, log) in enumerate(zip(argvs, envs, logs)):
        host = c.fabric.hosts[hosts[i] if hosts is not None else i]
        cmd = ["ip", "netns", "exec", host.namespace, sys.executable, *argv]
        with open(log, "w") as out:  # the rank keeps its own descriptor
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = start + timeout
    seconds = [0.0] * len(procs)
    running = set(range(len(procs)))
    while running and time.monotonic() < deadline:
        for i in [i for i in running if procs[i].poll() is not None]:
            seconds[i] = time.monotonic() - start
            running.discard(i)
        time.sleep(0.05)
    for i in running:  # late: killed
        procs[i].kill()
        procs[i].wait(5)
        seconds[i] = time.monotonic() - start
    texts = [log.read_text() for log in logs]
    ok = all(p.returncode == 0 for p in procs)
    assert ok or not check, "\n".join(t[-3000:] for t in texts)
    return texts, seconds
