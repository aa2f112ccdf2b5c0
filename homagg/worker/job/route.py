"""This host's side of the route to the controller: the source IP the kernel picks towards
it, the interface holding that IP and its MAC (or the same for a named interface)."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass

from homagg.worker.job.agent import AgentError, interface_mac


@dataclass(frozen=True)
class Route:
    """This host's side of the route to the controller."""

    ip: str
    iface: str
    mac: str


def route_to(address: str) -> Route:
    """The source IP, interface and MAC this host uses to reach `address` (host:port)."""
    host, _, port = address.rpartition(":")
    try:
        target = socket.getaddrinfo(host.strip("[]"), int(port or 0), socket.AF_INET)[0][4]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(target)  # no packet is sent: the kernel picks the route and source
            ip = s.getsockname()[0]
    except (OSError, ValueError) as exc:
        raise AgentError(f"no route to the controller {address}: {exc}") from exc
    iface = next((name for name, addr in ipv4_addresses() if addr == ip), None)
    if iface is None:
        raise AgentError(f"no interface holds {ip}, the source address towards the controller")
    return Route(ip, iface, interface_mac(iface))


def route_of(iface: str) -> Route:
    """The first IPv4 address and the MAC of interface `iface`."""
    ip = next((addr for name, addr in ipv4_addresses() if name == iface), None)
    if ip is None:
        raise AgentError(f"interface {iface!r} has no IPv4 address here")
    return Route(ip, iface, interface_mac(iface))


def ipv4_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of this network namespace, from `ip -o -4 addr`."""
    try:
        out = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise AgentError(f"cannot list this host's addresses: {exc}") from exc
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3:
            found.append((fields[1].split("@")[0], fields[3].split("/")[0]))
    return found
