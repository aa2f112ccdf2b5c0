"""The one addressing scheme of the test fabric, `make run` and the tests: worker host i
(0-based) has IP 10.0.0.<i+1>, MAC 02:00:00:00:01:<i+1> and sits on switch port i+1; the
switch answers as SERVICE_IP with SWITCH_MAC."""

from __future__ import annotations

from typing import Any

SWITCH_MAC = "02:00:00:00:00:fe"
SERVICE_IP = "10.0.0.254"
PREFIX_LEN = 24
MAX_HOSTS = 253  # 10.0.0.1 .. 10.0.0.253; .254 is the switch's service address


def _check(i: int) -> int:
    if not 0 <= i < MAX_HOSTS:
        raise ValueError(f"host index {i} is outside 0..{MAX_HOSTS - 1} of the 10.0.0.0/24 scheme")
    return i


def host_ip(i: int) -> str:
    """IPv4 address of host i (0-based)."""
    return f"10.0.0.{_check(i) + 1}"


def host_mac(i: int) -> str:
    """MAC address of host i (0-based)."""
    return f"02:00:00:00:01:{_check(i) + 1:02x}"


def host_switch_port(i: int) -> int:
    """The switch port host i (0-based) is attached to."""
    return _check(i) + 1


def host_entry(i: int) -> dict[str, Any]:
    """Host i as the controller's configuration lists it (ip, mac, switch_port)."""
    return {"ip": host_ip(i), "mac": host_mac(i), "switch_port": host_switch_port(i)}
