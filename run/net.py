"""The Mininet side of `make run`: a Switch class that runs our switch process (BMv2's
simple_switch_grpc or the reference switch) on its interfaces, as p4-utils/p4app do, and
the star topology (N hosts and the controller's host around one switch) or two levels (the
hosts split among leaf switches under a spine, the controller's host on the spine)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mininet.link import Link, TCLink
from mininet.net import Mininet
from mininet.node import Host, Switch

from homagg.lab.addresses import (
    CONTROLLER_INDEX,
    MAX_HOSTS_WITH_CONTROLLER,
    host_mac,
    host_switch_port,
)
from homagg.lab.namespace import in_namespace
from homagg.lab.rawsock import disable_offloads
from homagg.lab.switch_process import SwitchProcess
from run.names import DEFAULT_HOSTS, RunNames

MAX_LEAVES = 16  # leaves of a two-level topology: spine ports 1..16, below the controller's
UPLINK_PORT = 101  # a leaf's port toward the spine (the controller's host is on port 100)


@dataclass(frozen=True)
class Topology:
    """One switch, `hosts` worker hosts and the controller's host, on the switch ports of
    homagg.lab.addresses; `bw_mbit` > 0 shapes every link with htb (tc), 0 leaves them
    unshaped."""

    hosts: int = DEFAULT_HOSTS
    bw_mbit: float = 0.0
    # 0: one switch (a star); 2 or more: that many leaf switches under a spine, the hosts
    # split evenly among them and the controller's host on the spine (docs/run.md)
    leaves: int = 0

    def describe_bw(self) -> str:
        """The links' shaping, for titles: '100 Mbit/s (htb)' or 'unshaped'."""
        return f"{self.bw_mbit:g} Mbit/s (htb)" if self.bw_mbit else "unshaped"

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= MAX_HOSTS_WITH_CONTROLLER:
            raise ValueError(f"hosts must be 1..{MAX_HOSTS_WITH_CONTROLLER}, not {self.hosts}")
        if self.leaves and not (2 <= self.leaves <= MAX_LEAVES and self.hosts % self.leaves == 0):
            raise ValueError(
                f"leaves must be 2..{MAX_LEAVES} and divide hosts ({self.hosts}), not "
                f"{self.leaves} (0: one switch)"
            )

    @property
    def switches(self) -> int:
        """The run's switches: the one, or the leaves and the spine."""
        return self.leaves + 1 if self.leaves else 1

    @property
    def per_leaf(self) -> int:
        """Worker hosts on each leaf (all of them on a star)."""
        return self.hosts // self.leaves if self.leaves else self.hosts

    def place(self, i: int) -> tuple[int, int]:
        """(leaf, switch port) of worker host i: leaf -1 and port i + 1 on a star."""
        if not self.leaves:
            return -1, host_switch_port(i)
        return i // self.per_leaf, i % self.per_leaf + 1

    @staticmethod
    def load(path: Path, **overrides: Any) -> Topology:
        """Read [topology] hosts / bw_mbit from a TOML file; non-None overrides win."""
        data = tomllib.loads(path.read_text()).get("topology", {})
        unknown = set(data) - {"hosts", "bw_mbit", "leaves"}
        if unknown:
            raise ValueError(f"{path}: unknown key(s) in [topology]: {', '.join(sorted(unknown))}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return Topology(
            hosts=int(data.get("hosts", DEFAULT_HOSTS)),
            bw_mbit=float(data.get("bw_mbit", 0.0)),
            leaves=int(data.get("leaves", 0)),
        )


class P4Switch(Switch):
    """A Mininet switch backed by a P4Runtime switch process, in a network namespace of its
    own with its ports (BMv2's Thrift port listens on every interface of it: nothing else
    is there to reach it), P4Runtime on a Unix socket; the controller pushes the pipeline
    (no p4c, the committed artifacts)."""

    def __init__(
        self, name: str, target: str = "refswitch", log_path: str = "/tmp/switch.log", **params: Any
    ) -> None:
        super().__init__(name, **{**params, "inNamespace": True})
        self.controlIntf = None  # no control network: Mininet's default interface is a port
        self.target, self.log_path = target, Path(log_path)
        self.process: SwitchProcess | None = None

    @property
    def netns(self) -> str:
        """The switch's network namespace (its Mininet shell's)."""
        return f"/proc/{self.pid}/ns/net"

    def start(self, controllers: list[Any]) -> None:
        """Start the switch process on every data interface (port = Mininet's port number)."""
        ports = {self.ports[i]: i.name for i in self.intfList() if i.name != "lo"}
        self.cmd("ip link set lo up")  # as in a fabric's switch namespace (its own tools)
        with in_namespace(self.netns):
            for iface in ports.values():  # SwitchProcess turns their offloads off
                Path(f"/proc/sys/net/ipv6/conf/{iface}/disable_ipv6").write_text("1")
        self.process = SwitchProcess(self.target, ports, self.log_path, self.netns, self.name)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 (Mininet's name)
        """Stop the switch process by its PID, then remove the interfaces."""
        if self.process is not None:
            self.process.stop()
            self.process = None
        super().stop(deleteIntfs)


def build(topo: Topology, target: str, log_dir: Path, names: RunNames) -> Mininet:
    """Build the network of run `names` (its hosts, and its controller's host in the root
    namespace)."""
    link = TCLink if topo.bw_mbit > 0 else Link
    link_opts = {"bw": topo.bw_mbit} if topo.bw_mbit > 0 else {}
    net = Mininet(
        topo=None,
        build=False,
        controller=None,
        link=link,
        autoSetMacs=False,
        autoStaticArp=False,
        waitConnected=False,
    )

    def switch(name: str, log: str) -> Any:
        return net.addSwitch(
            name,
            cls=P4Switch,
            target=target,
            log_path=str(log_dir / log),
            dpid=f"{names.number:x}{name[len(names.switch) :]}",  # none from a name like hg3s
        )

    sw = switch(names.switch, "switch.log")
    leaves = [switch(names.leaf(k), f"switch-{names.leaf(k)}.log") for k in range(topo.leaves)]
    for k, leaf in enumerate(leaves):  # leaf k's uplink on its UPLINK_PORT, port k + 1 above
        net.addLink(leaf, sw, port1=UPLINK_PORT, port2=k + 1, **link_opts)
    for i in range(topo.hosts):
        ip = f"{names.host_ip(i)}/{names.prefix_len}"
        h = net.addHost(names.host(i), ip=ip, mac=host_mac(i))
        k, port = topo.place(i)
        net.addLink(h, leaves[k] if leaves else sw, port2=port, **link_opts)
    c = net.addHost(
        names.controller_host,
        cls=Host,
        inNamespace=False,
        ip=f"{names.controller_ip}/{names.prefix_len}",
        mac=host_mac(CONTROLLER_INDEX),
    )
    net.addLink(c, sw, port2=host_switch_port(CONTROLLER_INDEX), **link_opts)
    net.build()
    return net


def prepare_hosts(net: Mininet, python: str, names: RunNames) -> None:
    """IPv6 off and offloads off on every interface we made (a software switch must see the
    frames a wire would carry: no oversized TSO segments, no partial checksums), and the
    run's names in each worker host's /etc/hosts (write_hosts_file)."""
    hosts_file = write_hosts_file(names, sum(1 for h in net.hosts if h.inNamespace))
    for h in net.hosts:
        if h.inNamespace:
            # Mininet gives each host a mount namespace of its own (mnexec -n), with private
            # propagation: the bind mount is the host's alone and ends with it.
            h.cmd(f"mount --bind {hosts_file} /etc/hosts")
            h.cmd(
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
            )
            call = f'disable_offloads("{h.defaultIntf().name}")'
            h.cmd(f"{python} -c 'from homagg.lab.rawsock import disable_offloads; {call}'")
        else:
            disable_offloads(h.defaultIntf().name)


def write_hosts_file(names: RunNames, hosts: int) -> Path:
    """The machine's /etc/hosts plus the run's hosts by address, in the run's directory:
    c10d looks up the name of every peer's address for its log lines, and without an entry
    the lookup goes to a DNS server the hosts cannot reach, fails (EAI_AGAIN) and logs
    "The hostname of the client socket cannot be retrieved" in every rank's log."""
    base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    lines = ["# make run " + str(names.number) + ": its hosts", *names.hosts_lines(hosts)]
    names.hosts_file.write_text(base.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    return names.hosts_file
