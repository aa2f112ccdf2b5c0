"""Helpers of the controller tests: a switch target (the reference switch in-process, always;
BMv2 as a subprocess when simple_switch_grpc is installed) that can be restarted on the same
port, controller configurations, an in-process controller with its client, and readers of
what a switch really holds."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from homagg.api.client import ControllerClient
from homagg.control.config import ControllerConfig, parse_config
from homagg.control.install import reconcile
from homagg.control.service import ControllerServer
from homagg.control.switch_connection import SwitchConnection, SwitchError
from homagg.lab.addresses import SERVICE_IP, SWITCH_MAC, host_entry
from homagg.lab.fabric import fabric_tag
from homagg.lab.namespace import add_namespace, delete_namespace
from homagg.lab.poll import wait_for
from homagg.lab.switch_process import SwitchProcess, bmv2_available, free_port, p4runtime_socket
from homagg.refswitch.switch import ReferenceSwitch
from homagg.wire import p4names

HOSTS = [host_entry(i) for i in range(4)]
_switch_ids = itertools.count()
CLEARING_ELECTION_ID = 100  # above every controller's (10) and reader's (1..9)
TIMING = {"heartbeat_interval": 0.5, "lease": 3.0, "join_timeout": 10.0}
TARGETS = [
    pytest.param("refswitch", id="refswitch"),
    pytest.param(
        "bmv2",
        id="bmv2",
        marks=pytest.mark.skipif(
            not bmv2_available(),
            reason="simple_switch_grpc is not installed (BMv2 is built by hand, "
            "see docs/bmv2.md); the reference switch ran instead",
        ),
    ),
]


class SwitchUnderTest:
    """A switch on a fixed P4Runtime address that can be stopped and started again (losing
    its state): the reference switch in this process (TCP on 127.0.0.1), BMv2 in a network
    namespace of its own (its Thrift port with it) with P4Runtime on a Unix socket."""

    def __init__(self, target: str, workdir: Path) -> None:
        self.target, self.workdir = target, workdir
        self.name = fabric_tag(os.getpid(), next(_switch_ids) + 1000)
        self.netns = f"{self.name}sw"
        if target == "refswitch":
            self.address = f"127.0.0.1:{free_port()}"
        else:
            self.address = p4runtime_socket(self.name)
        self.refswitch: ReferenceSwitch | None = None
        self.process: SwitchProcess | None = None
        self.starts = 0
        self.start()

    def start(self) -> None:
        """Start the switch without a pipeline."""
        self.starts += 1
        if self.target == "refswitch":
            self.refswitch = ReferenceSwitch({}, self.address)
            self.refswitch.start()
            return
        add_namespace(self.netns)
        log = self.workdir / f"bmv2-{self.starts}.log"
        self.process = SwitchProcess("bmv2", {}, log, self.netns, self.name)

    @property
    def running(self) -> bool:
        """True while the switch process (or in-process server) runs."""
        proc = self.process.proc if self.process is not None else None
        return self.refswitch is not None or (proc is not None and proc.poll() is None)

    def stop(self) -> None:
        """Stop the switch (by PID for BMv2, its namespace removed)."""
        if self.refswitch is not None:
            self.refswitch.close()
            self.refswitch = None
        if self.process is not None:
            if self.process.proc.poll() is None:
                os.killpg(self.process.proc.pid, signal.SIGKILL)
            self.process.stop()
            self.process = None
            delete_namespace(self.netns)

    def restart(self) -> None:
        """A switch reboot: same address, no pipeline, no entries."""
        self.stop()
        self.start()

    def clear(self) -> None:
        """Remove every entry and multicast group (the pipeline stays), in a short primary
        session above the controllers' election id."""
        conn = SwitchConnection(self.address, election_id=CLEARING_ELECTION_ID, timeout=3.0)
        try:
            conn.connect()
            try:
                conn.get_p4info()
            except SwitchError:
                return  # no pipeline yet: nothing to remove
            reconcile(conn, [])
        finally:
            conn.close()


def config_dict(
    switches: list[tuple[str, str, list[dict]]], tmp_path: Path, **controller: Any
) -> dict:
    """A configuration document: (name, address, hosts) per switch, 10.0.<i>.254 service IPs."""
    ctl = {
        "listen": "127.0.0.1:0",
        "database": str(tmp_path / "controller.db"),
        **TIMING,
        **controller,
    }
    return {
        "controller": ctl,
        "switch": [
            {
                "name": name,
                "address": address,
                "mac": SWITCH_MAC,
                "service_ip": f"10.0.{100 + i}.254",
                "timeout": 1.0,
                "hosts": hosts,
            }
            for i, (name, address, hosts) in enumerate(switches)
        ],
    }


UPLINK_PORT = 100  # a leaf's port toward the parent in tree_config_dict


def tree_config_dict(
    addresses: tuple[str, str, str], tmp_path: Path, ranks_per_leaf: int = 2, **controller: Any
) -> dict:
    """A tree: 'spine' (no hosts) over 'leaf1' and 'leaf2', leaf k with hosts 0.. of subnet k
    (10.0.k.0/24), its uplink on port UPLINK_PORT and port k of the spine."""
    doc = config_dict(
        [
            ("spine", addresses[0], []),
            *[
                (f"leaf{k}", addresses[k], [host_entry(i, k) for i in range(ranks_per_leaf)])
                for k in (1, 2)
            ],
        ],
        tmp_path,
        **controller,
    )
    for k, sw in enumerate(doc["switch"]):
        sw["mac"] = f"02:00:00:00:{k:02x}:fe"
        sw["service_ip"] = f"10.0.{k or 100}.254"
        if k:
            sw.update(parent="spine", parent_port=UPLINK_PORT, port_on_parent=k)
    return doc


def make_config(address: str, tmp_path: Path, **controller: Any) -> ControllerConfig:
    """One switch 's1' at address with HOSTS, short leases."""
    doc = config_dict([("s1", address, HOSTS)], tmp_path, **controller)
    doc["switch"][0]["service_ip"] = SERVICE_IP
    return parse_config(doc, tmp_path)


class RunningController:
    """An in-process controller and a client of it."""

    def __init__(
        self,
        config: ControllerConfig,
        ca_file: Path | None = None,
        operator_token: str | None = None,
        **options: Any,
    ) -> None:
        self.config = config
        self.server = ControllerServer(config, poll_interval=0.05, max_backoff=0.3, **options)
        self.port = self.server.start()
        self.address = f"127.0.0.1:{self.port}"
        self.client = ControllerClient(
            self.address, 5.0, ca_file, operator_token, insecure=ca_file is None
        )
        self.manager = self.server.manager

    def wait_synced(self, timeout: float = 10.0) -> None:
        """Until every switch is connected and reconciled."""
        wait_for(
            lambda: all(s.connected for s in self.client.status().switches),
            timeout,
            "switches to sync",
        )

    def stop(self) -> None:
        self.client.close()
        self.server.stop(0)


def job_state(conn: SwitchConnection) -> dict[str, Any]:
    """What the switch holds for jobs: job_table by job id, worker/rewrite keys, multicast
    groups."""

    def ranks(table: str) -> list[tuple]:
        return sorted(
            (e.match["hdr.agg.job_id"], e.match["hdr.agg.rank"]) for e in conn.read_entries(table)
        )

    jobs = {e.match["hdr.agg.job_id"]: e.params for e in conn.read_entries(p4names.JOB_TABLE)}
    return {
        "jobs": jobs,
        "workers": ranks(p4names.WORKER_TABLE),
        "rewrites": ranks(p4names.RESULT_REWRITE),
        "groups": conn.read_multicast_groups(),
    }


def join_all(
    client: ControllerClient, job: Any, hosts: list[dict], udp_base: int = 41000
) -> list[Any]:
    """Join every rank of a job from hosts[rank]; returns the JoinJob responses."""
    return [
        client.join(
            job.job_id, job.token, rank, h["mac"], h["ip"], udp_base + rank, h["switch_port"]
        )
        for rank, h in enumerate(hosts)
    ]


def rpc_code(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """Run a call that must fail; its status code and details."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


class Env:
    """A controller on a switch with three jobs to misuse: `open` (world 2, rank 0 joined),
    `full` (world 1, ready), `gone` (ended); snapshot() is what must not change."""

    def __init__(self, ctl: RunningController, reader: SwitchConnection) -> None:
        self.ctl, self.c, self.reader = ctl, ctl.client, reader
        self.open = self.c.create_job("open", 2, "dense", pool_size=8)
        h0, h2 = HOSTS[0], HOSTS[2]
        self.open_join = dict(
            rank=0, mac=h0["mac"], ip=h0["ip"], udp_port=41000, switch_port=h0["switch_port"]
        )
        self.c.join(self.open.job_id, self.open.token, **self.open_join)
        self.full = self.c.create_job("full", 1, "dense", pool_size=8)
        self.full_join = dict(
            rank=0, mac=h2["mac"], ip=h2["ip"], udp_port=41000, switch_port=h2["switch_port"]
        )
        self.c.join(self.full.job_id, self.full.token, **self.full_join)
        self.gone = self.c.create_job("gone", 1, "dense", pool_size=8)
        self.c.release(self.gone.job_id)
        self.jobs = {"open": self.open, "full": self.full, "gone": self.gone}

    def snapshot(self) -> Any:
        jobs = self.c.list_jobs(include_ended=True)
        for job in jobs.jobs:
            for w in job.workers:
                w.lease_remaining_s = 0  # ticks by itself
        return jobs, self.c.list_pools(), job_state(self.reader)


@contextmanager
def bad_request_env(target: str, tmp: Path) -> Iterator[Env]:
    """A switch of kind `target`, a controller on it and a read-only P4Runtime reader, with Env's
    jobs."""
    switch = SwitchUnderTest(target, tmp)
    ctl = RunningController(make_config(switch.address, tmp, lease=60.0, heartbeat_interval=5.0))
    reader = SwitchConnection(switch.address, election_id=1, timeout=3.0)
    try:
        ctl.wait_synced()
        reader.connect(require_primary=False)
        yield Env(ctl, reader)
    finally:
        reader.close()
        ctl.stop()
        switch.stop()
