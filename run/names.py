"""Every name and address one `make run` owns, derived from its run number, so that two
runs on one machine never share an interface, a root-namespace route or a directory."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from homagg.lab.addresses import (
    CONTROLLER_INDEX,
    MAX_HOSTS_WITH_CONTROLLER,
    PREFIX_LEN,
    host_ip,
    service_ip,
)

STATE_DIR = Path(tempfile.gettempdir()) / "homagg-run"
# Run k owns the subnet 10.0.k.0/24; interface names stay within Linux's 15 characters
# ("hg254h99-eth0" is 13).
MAX_RUNS = 254
DEFAULT_HOSTS = 4  # worker hosts of a run that names no number; at most MAX_HOSTS_WITH_CONTROLLER


@dataclass(frozen=True)
class RunNames:
    """Names of run `number` (1..MAX_RUNS): Mininet nodes (hence their interfaces), the
    subnet of its hosts, controller and service address, and its directory."""

    number: int

    def __post_init__(self) -> None:
        if not 1 <= self.number <= MAX_RUNS:
            raise ValueError(f"run number {self.number} outside 1..{MAX_RUNS}")

    @property
    def switch(self) -> str:
        """The Mininet switch; its root-namespace interfaces are <switch>-ethN."""
        return f"hg{self.number}s"

    def leaf(self, k: int) -> str:
        """Leaf switch k (0-based) of a two-level topology, under `switch` (its spine)."""
        return f"hg{self.number}s{k + 1}"

    def leaf_service_ip(self, k: int) -> str:
        """Leaf k's aggregation service address: below the spine's (.254), above the hosts'."""
        return f"10.0.{self.number}.{253 - k}"

    @property
    def controller_host(self) -> str:
        """The controller's Mininet host (root namespace; interface <name>-eth0)."""
        return f"hg{self.number}c"

    def host(self, i: int) -> str:
        """Worker host i (0-based)."""
        if not 0 <= i < MAX_HOSTS_WITH_CONTROLLER:
            raise ValueError(f"host index {i} outside 0..{MAX_HOSTS_WITH_CONTROLLER - 1}")
        return f"hg{self.number}h{i + 1}"

    def host_ip(self, i: int) -> str:
        """Address of worker host i (0-based)."""
        self.host(i)
        return host_ip(i, self.number)

    @property
    def controller_ip(self) -> str:
        """The controller's address: in the root namespace, so it must differ per run."""
        return host_ip(CONTROLLER_INDEX, self.number)

    @property
    def service_ip(self) -> str:
        """The switch's aggregation service address, in the hosts' subnet."""
        return service_ip(self.number)

    @property
    def prefix_len(self) -> int:
        """Prefix length of the run's subnet."""
        return PREFIX_LEN

    @property
    def link_prefixes(self) -> tuple[str, str]:
        """Prefixes of every root-namespace interface of this run."""
        return f"{self.switch}-", f"{self.controller_host}-"

    @property
    def directory(self) -> Path:
        """The run's directory: its state file and, by default, its output."""
        return STATE_DIR / f"run{self.number}"

    @property
    def credentials_dir(self) -> Path:
        """The run's CA, controller key and operator credentials (run/credentials.py): removed
        when the run ends or `make stop` stops it."""
        return self.directory / "credentials"

    @property
    def hosts_file(self) -> Path:
        """The /etc/hosts its hosts see (run/net.py): every name of the run by address."""
        return self.directory / "hosts"

    def hosts_lines(self, hosts: int) -> list[str]:
        """/etc/hosts lines naming the run's worker hosts and controller host, so that a
        reverse lookup of their addresses (c10d's, for its log lines) is answered locally
        instead of by a DNS server the lab cannot reach; also as IPv4-mapped IPv6 addresses,
        which c10d's dual-stack sockets report and the files lookup matches only verbatim."""
        named = [(self.host_ip(i), self.host(i)) for i in range(hosts)]
        named.append((self.controller_ip, self.controller_host))
        return [f"{prefix}{ip}\t{name}" for prefix in ("", "::ffff:") for ip, name in named]

    @property
    def state_file(self) -> Path:
        """What the run started, while it runs (run/state.py)."""
        return self.directory / "state.json"
