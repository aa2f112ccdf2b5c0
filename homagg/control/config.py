"""The controller's configuration file (TOML): where it listens and stores its state, its
lease timing, and the switches it manages with the hosts attached to each. The format is
documented with an example in docs/controller.md; every mistake is a ConfigError that
names the offending key."""

from __future__ import annotations

import ipaddress
import math
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from homagg.api.client import DEFAULT_LISTEN
from homagg.api.credentials import ROLES, TENANT, TENANT_MAX_JOBS, TENANT_MAX_SLOTS, Operator
from homagg.control.forwarding import Host
from homagg.metrics_endpoint import is_loopback_host, split_address
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.wire.constants import (
    CELLS_CHOICES,
    CELLS_PER_PKT,
    MAX_JOB_ID,
    MAX_L4_PORT,
    MAX_SWITCH_PORT,
    NUM_SLOTS,
)

MAX_PORT_BUFFER = 1 << 20  # slots in flight per port: far beyond any target's buffer
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class SwitchConfig:
    """One switch: how to reach its P4Runtime server and what to install on it."""

    name: str
    address: str
    mac: str
    service_ip: str
    hosts: tuple[Host, ...] = ()
    device_id: int = 0
    election_id: int = 10
    timeout: float = 5.0
    # The program pushed to this switch: None is the committed v1model build (BMv2, the
    # reference switch); a Tofino switch names the TNA P4Info and its packed device config
    # (docs/tofino.md). Both or neither.
    p4info: Path | None = None
    device_config: Path | None = None
    # Cells per packet of the switch's program, handed to its jobs' workers in the
    # assignment: the committed v1model build's by default; a switch that names its own
    # program says its own (the TNA program's default build: 64).
    cells_per_packet: int = CELLS_PER_PKT
    # The largest pool a job gets here: chunks in flight per rank, which reach its port back
    # to back. BMv2 buffers about 1,300 frames per port (docs/bmv2.md): 1024 there.
    max_pool_size: int = NUM_SLOTS
    # Slots in flight one switch port buffers, shared by every job with a rank on the port
    # (homagg/control/port_buffer.py): the frames the target buffers per port less room for
    # resends and ARP (BMv2: 1024 of its ~1,300). Default: the switch's max_pool_size.
    port_buffer: int = NUM_SLOTS
    # A leaf of a tree (docs/controller.md, "Trees of switches"): the switch above it, this
    # switch's port toward it and its port toward this switch. "" and None: not a leaf.
    parent: str = ""
    parent_port: int | None = None
    port_on_parent: int | None = None

    @property
    def lane_ops(self) -> bool:
        """Whether the switch's program adds 16- and 8-bit lanes (ADD16, ADD8): the
        committed v1model program does; the TNA program drops them (docs/tofino.md)."""
        return self.p4info is None

    def host_by_ip(self, ip: str) -> Host | None:
        """The configured host with this IPv4 address, if any."""
        return next((h for h in self.hosts if h.ip == ip), None)


@dataclass(frozen=True)
class ControllerConfig:
    """Everything `aggctl serve` needs."""

    switches: tuple[SwitchConfig, ...]
    database: Path
    listen: str = DEFAULT_LISTEN
    heartbeat_interval: float = 2.0
    lease: float = 10.0
    join_timeout: float = 60.0
    default_pool_size: int = 64
    rpc_threads: int = 128
    wait_ready_limit: int = 96  # parked WaitReady calls (homagg/control/waiting.py)
    wait_ready_per_client: int = 64
    tls_cert: Path | None = None  # PEM certificate of the gRPC port (with tls_key: TLS)
    tls_key: Path | None = None
    max_job_slots: int = NUM_SLOTS  # per-job quota: the largest pool one job may ask for
    operators: tuple[Operator, ...] = ()  # credentials of operator RPCs and CreateJob
    # Prometheus metrics (homagg/control/metrics.py): HOST:PORT to serve them on ("" off), a
    # non-loopback HOST only with metrics_non_loopback, the switches' counters read every
    # metrics_interval seconds (cached: a scrape never reads a switch).
    metrics_listen: str = ""
    metrics_non_loopback: bool = False
    metrics_interval: float = 5.0

    def switch(self, name: str) -> SwitchConfig | None:
        """The switch with this name, if configured."""
        return next((s for s in self.switches if s.name == name), None)


class _Reader:
    """Typed access to one TOML table, with errors that say where they are."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a table, got {type(data).__name__}")
        self.data, self.where = data, where
        self.used: set[str] = set()

    def _get(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise ConfigError(f"{self.where}: missing key '{key}'")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise ConfigError(f"{self.where}.{key}: expected {names}, got {value!r}")
        return value

    def string(self, key: str, default: Any = None) -> str:
        return self._get(key, str, _REQUIRED if default is None else default)

    def integer(self, key: str, default: Any, low: int, high: int) -> int:
        value = self._get(key, int, default)
        if not low <= value <= high:
            raise ConfigError(f"{self.where}.{key}: {value} outside {low}..{high}")
        return value

    def seconds(self, key: str, default: float) -> float:
        value = float(self._get(key, (int, float), default))
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(
                f"{self.where}.{key}: expected a positive number of seconds, got {value}"
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        self.used.add(key)
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}.{key}: expected true or false, got {value!r}")
        return value

    def tables(self, key: str) -> list[Any]:
        return self._get(key, list, [])

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(f"{self.where}: unknown key(s) {', '.join(unknown)}")


_REQUIRED = object()


def check_address(address: str, where: str, any_port: bool = False, unix: bool = False) -> str:
    """'host:port' with a port in 1..65535 (0 too with any_port: the OS picks one); with
    `unix` also 'unix:/absolute/path' (a Unix socket: the lab's switches serve P4Runtime so)."""
    if unix and address.startswith("unix:"):
        if not address.startswith("unix:/") or len(address) > len("unix:") + 107:
            raise ConfigError(
                f"{where}: expected unix:/ABSOLUTE/PATH (at most 107 characters), got {address!r}"
            )
        return address
    host, sep, port = address.rpartition(":")
    lowest = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) <= MAX_L4_PORT:
        also = " or unix:/PATH" if unix else ""
        raise ConfigError(f"{where}: expected HOST:PORT{also}, got {address!r}")
    return address


def is_loopback(listen: str) -> bool:
    """True when a listen address is reachable from this host only: a Unix socket, or a host
    that is (or resolves only to) loopback addresses."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return True
    host = listen.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def _check(fn: Any, value: str, where: str) -> str:
    try:
        fn(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return value


def _host(data: Any, where: str) -> Host:
    r = _Reader(data, where)
    host = Host(
        ip=_check(ipv4_to_int, r.string("ip"), f"{where}.ip"),
        mac=_check(mac_to_int, r.string("mac"), f"{where}.mac"),
        switch_port=r.integer("switch_port", _REQUIRED, 0, MAX_SWITCH_PORT),
    )
    r.finish()
    return host


def _program_file(r: _Reader, key: str, base_dir: Path, where: str) -> Path | None:
    """An optional program file of a switch entry, relative to the config file."""
    value = r.string(key, "")
    if not value:
        return None
    path = Path(value) if Path(value).is_absolute() else base_dir / value
    if not path.is_file():
        raise ConfigError(f"{where}.{key}: {path} is not a file")
    return path


def _cells_per_packet(r: _Reader, own_program: bool, where: str) -> int:
    """A switch's cells per packet: required with its own program (the controller cannot
    tell it from a P4Info), else the committed build's."""
    if own_program and "cells_per_packet" not in r.data:
        raise ConfigError(
            f"{where}: a switch with its own p4info needs cells_per_packet (what its "
            "program was built for: 64 for p4src/tofino's default build)"
        )
    cells = r.integer("cells_per_packet", CELLS_PER_PKT, min(CELLS_CHOICES), max(CELLS_CHOICES))
    if cells not in CELLS_CHOICES:
        raise ConfigError(f"{where}.cells_per_packet: {cells} is none of {CELLS_CHOICES}")
    return cells


def _optional_port(r: _Reader, key: str) -> int | None:
    """A switch port that may be absent (None)."""
    return r.integer(key, _REQUIRED, 0, MAX_SWITCH_PORT) if key in r.data else None


def _check_uplink_keys(sw: SwitchConfig, where: str) -> None:
    """A leaf's three keys go together, and its uplink port is not a host's."""
    keys = ("parent", "parent_port", "port_on_parent")
    given = [k for k in keys if getattr(sw, k) not in ("", None)]
    if given and len(given) < 3:
        raise ConfigError(
            f"{where}: a leaf switch needs parent, parent_port (its port toward the parent) and "
            f"port_on_parent (the parent's port toward it); only {', '.join(given)} given"
        )
    if sw.parent_port is not None and any(h.switch_port == sw.parent_port for h in sw.hosts):
        raise ConfigError(
            f"{where}.parent_port: port {sw.parent_port} is also a host's port of {sw.name}: "
            "the uplink needs a port of its own"
        )


def _switch(data: Any, where: str, base_dir: Path) -> SwitchConfig:
    r = _Reader(data, where)
    name = r.string("name")
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not 1..32 of [A-Za-z0-9_.-]")
    hosts = tuple(_host(h, f"{where}.hosts[{i}]") for i, h in enumerate(r.tables("hosts")))
    p4info = _program_file(r, "p4info", base_dir, where)
    sw = SwitchConfig(
        name=name,
        address=check_address(r.string("address"), f"{where}.address", unix=True),
        mac=_check(mac_to_int, r.string("mac"), f"{where}.mac"),
        service_ip=_check(ipv4_to_int, r.string("service_ip"), f"{where}.service_ip"),
        hosts=hosts,
        device_id=r.integer("device_id", 0, 0, 2**64 - 1),
        election_id=r.integer("election_id", 10, 1, 2**63 - 1),
        timeout=r.seconds("timeout", 5.0),
        p4info=p4info,
        device_config=_program_file(r, "device_config", base_dir, where),
        cells_per_packet=_cells_per_packet(r, p4info is not None, where),
        max_pool_size=(most := r.integer("max_pool_size", NUM_SLOTS, 1, NUM_SLOTS)),
        port_buffer=r.integer("port_buffer", most, 1, MAX_PORT_BUFFER),
        parent=r.string("parent", ""),
        parent_port=_optional_port(r, "parent_port"),
        port_on_parent=_optional_port(r, "port_on_parent"),
    )
    r.finish()
    _check_uplink_keys(sw, where)
    if (sw.p4info is None) != (sw.device_config is None):
        raise ConfigError(f"{where}: give both p4info and device_config, or neither")
    ips = [h.ip for h in hosts]
    for ip in ips:
        if ips.count(ip) > 1:
            raise ConfigError(f"{where}.hosts: {ip} is listed twice")
    if sw.service_ip in ips:
        raise ConfigError(f"{where}.service_ip: {sw.service_ip} is also a host's address")
    return sw


def _operator(data: Any, where: str) -> Operator:
    r = _Reader(data, where)
    name = r.string("name")
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not 1..32 of [A-Za-z0-9_.-]")
    digest = r.string("token_sha256").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ConfigError(
            f"{where}.token_sha256: expected the 64 hex digits of the token's SHA-256 "
            '(printf %s "$TOKEN" | sha256sum)'
        )
    role = r.string("role", TENANT)
    if role not in ROLES:
        raise ConfigError(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}")
    tenant = role == TENANT
    op = Operator(
        name=name,
        token_sha256=digest,
        role=role,
        # no more jobs than ids; a tenant's defaults bound what one credential can take
        max_jobs=r.integer("max_jobs", TENANT_MAX_JOBS if tenant else 0, 0, MAX_JOB_ID),
        max_slots=r.integer("max_slots", TENANT_MAX_SLOTS if tenant else 0, 0, NUM_SLOTS),
    )
    r.finish()
    return op


def _optional_path(ctl: _Reader, key: str, base_dir: Path) -> Path | None:
    """A file named by `key` (relative to the config's directory); None when absent or ""."""
    value = ctl.string(key, "")
    if not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else base_dir / path


def parse_config(
    data: Mapping[str, Any], base_dir: Path, where: str = "config"
) -> ControllerConfig:
    """Validate a parsed TOML document; relative paths are taken from base_dir."""
    top = _Reader(data, where)
    ctl = _Reader(top._get("controller", Mapping, {}), f"{where}: controller")
    switches = tuple(
        _switch(s, f"{where}: switch[{i}]", base_dir) for i, s in enumerate(top.tables("switch"))
    )
    operators = tuple(
        _operator(o, f"{where}: operator[{i}]") for i, o in enumerate(top.tables("operator"))
    )
    top.finish()
    _check_unique(switches, operators, where)
    from homagg.control.tree_config import check_tree  # it imports this module

    check_tree(switches, where)
    database = Path(ctl.string("database", "homagg-controller.db"))
    config = ControllerConfig(
        switches=switches,
        database=database if database.is_absolute() else base_dir / database,
        listen=check_address(
            ctl.string("listen", DEFAULT_LISTEN), f"{where}: controller.listen", any_port=True
        ),
        heartbeat_interval=ctl.seconds("heartbeat_interval", 2.0),
        lease=ctl.seconds("lease", 10.0),
        join_timeout=ctl.seconds("join_timeout", 60.0),
        default_pool_size=ctl.integer("default_pool_size", 64, 1, NUM_SLOTS),
        rpc_threads=ctl.integer("rpc_threads", 128, 4, 4096),
        tls_cert=_optional_path(ctl, "tls_cert", base_dir),
        tls_key=_optional_path(ctl, "tls_key", base_dir),
        max_job_slots=ctl.integer("max_job_slots", NUM_SLOTS, 1, NUM_SLOTS),
        operators=operators,
        metrics_listen=_metrics_listen(ctl, f"{where}: controller.metrics_listen"),
        metrics_non_loopback=ctl.flag("metrics_non_loopback", False),
        metrics_interval=ctl.seconds("metrics_interval", 5.0),
    )
    config = _wait_limits(ctl, config)
    ctl.finish()
    _check_consistent(config, where)
    check_metrics_exposure(config, where)
    return config


def _check_unique(
    switches: tuple[SwitchConfig, ...], operators: tuple[Operator, ...], where: str
) -> None:
    """At least one switch; no two switches or operators share a name, an address or a
    token."""
    for key in ("name", "token_sha256"):
        values = [getattr(o, key) for o in operators]
        if len(set(values)) != len(values):
            raise ConfigError(f"{where}: two operators have the same {key}")
    if not switches:
        raise ConfigError(f"{where}: no [[switch]] configured")
    for key in ("name", "address"):
        values = [getattr(s, key) for s in switches]
        dup = next((v for v in values if values.count(v) > 1), None)
        if dup is not None:
            raise ConfigError(f"{where}: two switches have {key} {dup!r}")


def _check_consistent(config: ControllerConfig, where: str) -> None:
    """The settings that depend on each other: TLS's two files, the default pool within the
    quota, a lease that outlasts two heartbeats."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError(f"{where}: controller.tls_cert and controller.tls_key go together")
    if config.default_pool_size > config.max_job_slots:
        raise ConfigError(
            f"{where}: controller.default_pool_size ({config.default_pool_size}) is over the "
            f"quota controller.max_job_slots ({config.max_job_slots})"
        )
    if config.lease < 2 * config.heartbeat_interval:
        raise ConfigError(
            f"{where}: controller.lease ({config.lease} s) must be at least twice "
            f"heartbeat_interval ({config.heartbeat_interval} s)"
        )


def _metrics_listen(ctl: _Reader, where: str) -> str:
    """The metrics address: "" (off) or HOST:PORT (port 0: the OS picks one)."""
    value = ctl.string("metrics_listen", "")
    return check_address(value, where, any_port=True) if value else ""


def check_metrics_exposure(config: ControllerConfig, where: str) -> None:
    """A metrics address other hosts can reach needs metrics_non_loopback (or its flag)."""
    listen = config.metrics_listen
    if listen and not (config.metrics_non_loopback or is_loopback_host(split_address(listen)[0])):
        raise ConfigError(
            f"{where}: metrics_listen {listen} is not a loopback address: whoever reaches "
            "it reads every job's numbers. Listen on 127.0.0.1, or set "
            "controller.metrics_non_loopback = true (--metrics-non-loopback) to expose it"
        )


def _wait_limits(ctl: _Reader, config: ControllerConfig) -> ControllerConfig:
    """Parked WaitReady calls leave at least a quarter of the request threads to the rest."""
    most = config.rpc_threads - max(1, config.rpc_threads // 4)
    total = ctl.integer("wait_ready_limit", most, 1, most)
    per_client = ctl.integer("wait_ready_per_client", max(1, total * 2 // 3), 1, total)
    return replace(config, wait_ready_limit=total, wait_ready_per_client=per_client)


def load_config(path: Path | str) -> ControllerConfig:
    """Read and validate a TOML configuration file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, path.resolve().parent, str(path))
