"""A switch (BMv2 or the reference switch) with hosts in network namespaces around it,
its pipeline pushed and its forwarding entries installed: the stage of the packet tests
and of the benchmarks. Everything it makes carries a tag of ours and goes in close().
homagg/lab/tree_fabric.py joins several of them into a tree of switches."""

from __future__ import annotations

import itertools
import os
import re
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.forwarding import Host, PeerService, forwarding_entries
from homagg.control.install import reconcile
from homagg.control.switch_connection import SwitchConnection
from homagg.lab.addresses import (
    SERVICE_IP,
    SWITCH_MAC,
    host_ip,
    host_mac,
    host_switch_port,
    service_ip,
    switch_mac,
)
from homagg.lab.namespace import (
    add_namespace,
    add_veth,
    delete_namespace,
    in_namespace,
    ip,
)
from homagg.lab.rawsock import RawPort, disable_offloads
from homagg.lab.switch_process import SwitchProcess

__all__ = [
    "PID_DIR",
    "SERVICE_IP",  # the default subnet's addresses, which most fabrics use
    "SWITCH_MAC",
    "TAG_PATTERN",
    "Fabric",
    "FabricHost",
    "fabric_tag",
    "new_fabric_tag",
]

PID_DIR = Path(tempfile.gettempdir()) / "homagg-fabrics"  # switch PIDs, for `make stop`
_fabric_ids = itertools.count()
# hg<owner pid>x<n>{h|s}<host>: a host's namespace and link; hg<owner pid>x<n>sw: the switch's;
# hg<owner pid>x<n>{u|p}<leaf>: a tree fabric's link between a leaf and its parent
TAG_PATTERN = re.compile(r"^hg(\d+)x(\d+)(?:[hsup]\d+|sw)$")


def fabric_tag(owner_pid: int, n: int) -> str:
    """Prefix of every name a fabric makes; interface names stay within 15 characters."""
    return f"hg{owner_pid}x{n}"


def new_fabric_tag() -> str:
    """A tag of this process that no other fabric of it has (nor a tree fabric's links)."""
    return fabric_tag(os.getpid(), next(_fabric_ids))


@dataclass
class FabricHost:
    """A host namespace with one link to the switch and a raw socket on it."""

    index: int
    namespace: str
    iface: str
    switch_iface: str
    switch_port: int
    mac: str
    ip: str
    _raw: RawPort | None = field(default=None, repr=False)

    @property
    def raw(self) -> RawPort:
        """The host's raw socket, open once the fabric has built this host."""
        if self._raw is None:
            raise RuntimeError(f"host {self.index} has no raw port: the fabric is not built")
        return self._raw

    @raw.setter
    def raw(self, port: RawPort) -> None:
        self._raw = port

    def enable_ip_stack(self) -> None:
        """Give the host's kernel its address, for tests that use ordinary sockets."""
        ip("addr", "add", f"{self.ip}/24", "dev", self.iface, netns=self.namespace)


class Fabric:
    """num_hosts hosts on ports 1..num_hosts of one switch of kind `target`, running the
    program in `artifacts` (P4Info, BMv2 JSON). The switch and its ends of the links are in a
    namespace of their own (`switch_namespace`; homagg/lab/switch_process.py says why), its
    P4Runtime on a Unix socket (`switch.address`). The hosts and the switch's service
    address are in subnet `subnet` (homagg/lab/addresses.py); `links`: more switch ports,
    PORT -> a link made elsewhere in this namespace, which the switch's namespace takes
    (a link to another switch); `peers`: the service addresses of the other switches of its
    tree and the ports toward them."""

    def __init__(
        self,
        target: str,
        num_hosts: int,
        workdir: Path | None = None,
        artifacts: tuple[Path, Path] = (P4INFO_PATH, BMV2_JSON_PATH),
        metrics_port: int | None = None,
        subnet: int = 0,
        links: dict[int, str] | None = None,
        peers: tuple[PeerService, ...] = (),
    ) -> None:
        self.target = target
        self.metrics_port = metrics_port  # the switch's metrics, on its namespace's loopback
        self.artifacts = artifacts
        self.subnet = subnet
        self.service_ip = service_ip(subnet)
        self.switch_mac = switch_mac(subnet)
        self.links = dict(links or {})
        self.peers = peers  # the other switches of its tree (service_source)
        self.tag = new_fabric_tag()
        self.switch_namespace = f"{self.tag}sw"
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.hosts: list[FabricHost] = []
        self._switch: SwitchProcess | None = None
        self._restarts = 0
        self._conn: SwitchConnection | None = None
        try:
            self._build(num_hosts)
        except BaseException:
            self.close()
            raise

    def _build(self, num_hosts: int) -> None:
        add_namespace(self.switch_namespace)
        for link in self.links.values():
            ip("link", "set", "dev", link, "netns", self.switch_namespace)
            ip("link", "set", "dev", link, "up", netns=self.switch_namespace)
        for i in range(num_hosts):
            host = FabricHost(
                index=i,
                namespace=f"{self.tag}h{i}",
                iface=f"{self.tag}h{i}",
                switch_iface=f"{self.tag}s{i}",
                switch_port=host_switch_port(i),
                mac=host_mac(i),
                ip=host_ip(i, self.subnet),
            )
            self.hosts.append(host)
            add_namespace(host.namespace)
            add_veth(host.switch_iface, host.iface, host.namespace, self.switch_namespace)
            ip("link", "set", "dev", host.iface, "address", host.mac, netns=host.namespace)
            with in_namespace(host.namespace):
                disable_offloads(host.iface)
                host.raw = RawPort(host.iface)
        self.switch = SwitchProcess(
            self.target,
            self.switch_ports,
            self.workdir / "switch.log",
            self.switch_namespace,
            self.tag,
            metrics_port=self.metrics_port,
        )
        PID_DIR.mkdir(exist_ok=True)
        (PID_DIR / f"{self.tag}.pid").write_text(str(self.switch.proc.pid))
        self.load_program(self.artifacts)

    def load_program(self, artifacts: tuple[Path, Path]) -> None:
        """Connect to the switch as primary and push `artifacts` (P4Info, device config) and
        the hosts' forwarding entries: what a new fabric starts with."""
        self.release_connection()
        self.conn = SwitchConnection(self.switch.address)
        self.conn.connect()
        self.conn.set_pipeline(*artifacts)
        self.artifacts = artifacts
        hosts = [Host(ip=h.ip, mac=h.mac, switch_port=h.switch_port) for h in self.hosts]
        entries = forwarding_entries(hosts, self.service_ip, self.switch_mac, peers=self.peers)
        reconcile(self.conn, entries, read_back=False)

    @property
    def switch_ports(self) -> dict[int, str]:
        """Every port of the switch: PORT -> its interface in the switch's namespace."""
        return {**{h.switch_port: h.switch_iface for h in self.hosts}, **self.links}

    def restart_switch(self, kill: bool = True, env: dict[str, str] | None = None) -> None:
        """Replace the switch by a fresh one (no pipeline, no entries) on the same ports and
        P4Runtime address, as after a crash (kill) or a clean restart; `env`: variables the
        new switch process gets on top of its usual environment."""
        old = self.switch
        if kill and old.proc.poll() is None:
            os.killpg(old.proc.pid, signal.SIGKILL)
        old.stop()
        self._restarts += 1
        self.switch = SwitchProcess(
            self.target,
            self.switch_ports,
            self.workdir / f"switch-{self._restarts}.log",
            self.switch_namespace,
            self.tag,  # the same P4Runtime address
            metrics_port=self.metrics_port,
            env=env,
        )
        (PID_DIR / f"{self.tag}.pid").write_text(str(self.switch.proc.pid))

    def drain(self) -> None:
        """Discard frames queued at every host."""
        for h in self.hosts:
            h.raw.drain()

    def close(self) -> None:
        """Stop the switch and remove every namespace and link this fabric made."""
        self.release_connection()
        if self._switch is not None:
            self._switch.stop()
            (PID_DIR / f"{self.tag}.pid").unlink(missing_ok=True)
        for h in self.hosts:
            if h._raw is not None:
                h._raw.close()
            delete_namespace(h.namespace)
        delete_namespace(self.switch_namespace)  # with the switch's ends of the links

    @property
    def conn(self) -> SwitchConnection:
        """The fabric's P4Runtime connection, primary since the fabric was built."""
        if self._conn is None:
            raise RuntimeError(
                "fabric has no switch connection: it failed to build or was released"
            )
        return self._conn

    @conn.setter
    def conn(self, conn: SwitchConnection | None) -> None:
        self._conn = conn

    def release_connection(self) -> None:
        """Close the fabric's connection, so another client (a controller) becomes primary."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def switch(self) -> SwitchProcess:
        """The running switch process (a fresh one after restart_switch())."""
        if self._switch is None:
            raise RuntimeError("fabric has no switch: it failed to build or is closed")
        return self._switch

    @switch.setter
    def switch(self, process: SwitchProcess) -> None:
        self._switch = process

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
