"""The one addressing scheme of the test fabric, `make run` and the tests: in subnet k
(10.0.k.0/24; the test fabric uses 0, `make run` number k uses k), worker host i (0-based)
has IP 10.0.k.<i+1>, MAC 02:00:00:00:01:<i+1> and sits on switch port i+1; the controller's
host, when it is in the subnet (`make run`), is host CONTROLLER_INDEX (IP, MAC and port
alike); the switch answers as 10.0.k.254 with SWITCH_MAC. Where several switches each have
a subnet (the tree fabric: a parent and its leaves), switch k's MAC is switch_mac(k)."""

from __future__ import annotations

from typing import Any

PREFIX_LEN = 24
MAX_HOSTS = 253  # 10.0.k.1 .. 10.0.k.253; .254 is the switch's service address
MAX_SUBNET = 254
# The controller's host, when it is in the subnet: an index above every worker host's, so
# a network with it has at most MAX_HOSTS_WITH_CONTROLLER worker hosts (0..98).
CONTROLLER_INDEX = 99
MAX_HOSTS_WITH_CONTROLLER = CONTROLLER_INDEX


def _check(i: int) -> int:
    if not 0 <= i < MAX_HOSTS:
        raise ValueError(f"host index {i} is outside 0..{MAX_HOSTS - 1} of the /24 scheme")
    return i


def _subnet(k: int) -> int:
    if not 0 <= k <= MAX_SUBNET:
        raise ValueError(f"subnet {k} is outside 0..{MAX_SUBNET} (10.0.k.0/24)")
    return k


def host_ip(i: int, subnet: int = 0) -> str:
    """IPv4 address of host i (0-based) in subnet 10.0.<subnet>.0/24."""
    return f"10.0.{_subnet(subnet)}.{_check(i) + 1}"


def service_ip(subnet: int = 0) -> str:
    """The switch's aggregation service address in subnet 10.0.<subnet>.0/24."""
    return f"10.0.{_subnet(subnet)}.254"


SERVICE_IP = service_ip(0)


def switch_mac(subnet: int = 0) -> str:
    """The MAC of the switch of subnet k: 02:00:00:00:00:<fe - k> (hosts' MACs have 01 in
    their fifth byte, so none is a switch's)."""
    return f"02:00:00:00:00:{0xFE - _subnet(subnet):02x}"


SWITCH_MAC = switch_mac(0)


def host_mac(i: int) -> str:
    """MAC address of host i (0-based); subnets share MACs (they never share a link)."""
    return f"02:00:00:00:01:{_check(i) + 1:02x}"


def host_switch_port(i: int) -> int:
    """The switch port host i (0-based) is attached to."""
    return _check(i) + 1


def host_entry(i: int, subnet: int = 0) -> dict[str, Any]:
    """Host i as the controller's configuration lists it (ip, mac, switch_port)."""
    return {"ip": host_ip(i, subnet), "mac": host_mac(i), "switch_port": host_switch_port(i)}
