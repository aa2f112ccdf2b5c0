"""Entries of the Forwarding control (p4src/forwarding.p4): proxy ARP and IPv4 routes for
the hosts of a switch, and the aggregation service address."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from homagg.control.entries import EntrySpec
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.wire import p4names


@dataclass(frozen=True)
class Host:
    """A host attached to a switch port, and the addresses the switch rewrites to reach it."""

    ip: str
    mac: str
    switch_port: int


def _proxy_arp(ip: str, switch_mac: str) -> EntrySpec:
    return EntrySpec.of(
        p4names.ARP_RESPONDER,
        {"hdr.arp.tpa": ipv4_to_int(ip)},
        p4names.ARP_REPLY,
        {"mac": mac_to_int(switch_mac)},
    )


def host_entries(host: Host, switch_mac: str) -> list[EntrySpec]:
    """Answer ARP for the host with the switch's MAC and route its /32 to its port."""
    route = EntrySpec.of(
        p4names.IPV4_LPM,
        {"hdr.ipv4.dst_addr": (ipv4_to_int(host.ip), 32)},
        p4names.ROUTE,
        {
            "port": host.switch_port,
            "src_mac": mac_to_int(switch_mac),
            "dst_mac": mac_to_int(host.mac),
        },
    )
    return [_proxy_arp(host.ip, switch_mac), route]


def service_entries(service_ip: str, switch_mac: str) -> list[EntrySpec]:
    """Make service_ip the aggregation address: ARP answered, packets to it aggregated."""
    aggregate = EntrySpec.of(
        p4names.IPV4_LPM,
        {"hdr.ipv4.dst_addr": (ipv4_to_int(service_ip), 32)},
        p4names.AGGREGATE,
        {},
    )
    return [_proxy_arp(service_ip, switch_mac), aggregate]


def forwarding_entries(hosts: Iterable[Host], service_ip: str, switch_mac: str) -> list[EntrySpec]:
    """Every Forwarding entry of a switch: its hosts and its aggregation service address."""
    return [e for h in hosts for e in host_entries(h, switch_mac)] + service_entries(
        service_ip, switch_mac
    )
