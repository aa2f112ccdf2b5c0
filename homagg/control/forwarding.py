"""Entries of the Forwarding control (p4src/forwarding.p4): proxy ARP and IPv4 routes for
the hosts of a switch, the aggregation service address, and the ports the service addresses
of its tree may arrive on (service_source)."""

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


def _route(ip: str, port: int, switch_mac: str, next_mac: str) -> EntrySpec:
    return EntrySpec.of(
        p4names.IPV4_LPM,
        {"hdr.ipv4.dst_addr": (ipv4_to_int(ip), 32)},
        p4names.ROUTE,
        {"port": port, "src_mac": mac_to_int(switch_mac), "dst_mac": mac_to_int(next_mac)},
    )


def host_entries(host: Host, switch_mac: str) -> list[EntrySpec]:
    """Answer ARP for the host with the switch's MAC and route its /32 to its port."""
    return [
        _proxy_arp(host.ip, switch_mac),
        _route(host.ip, host.switch_port, switch_mac, host.mac),
    ]


@dataclass(frozen=True)
class Transit:
    """A host behind another switch of a tree: the port toward it and the next switch's MAC."""

    host: Host
    port: int
    next_mac: str


def transit_entries(transit: Transit, switch_mac: str) -> list[EntrySpec]:
    """Answer ARP for a host behind another switch of the tree and route its /32 toward it
    (a leaf up to its parent, a parent down to the host's leaf)."""
    ip = transit.host.ip
    return [_proxy_arp(ip, switch_mac), _route(ip, transit.port, switch_mac, transit.next_mac)]


def service_entries(service_ip: str, switch_mac: str) -> list[EntrySpec]:
    """Make service_ip the aggregation address: ARP answered, packets to it aggregated."""
    aggregate = EntrySpec.of(
        p4names.IPV4_LPM,
        {"hdr.ipv4.dst_addr": (ipv4_to_int(service_ip), 32)},
        p4names.AGGREGATE,
        {},
    )
    return [_proxy_arp(service_ip, switch_mac), aggregate]


@dataclass(frozen=True)
class PeerService:
    """Another switch of the tree: its service address and the port toward that switch."""

    ip: str
    port: int


def service_source_entries(service_ip: str, peers: Iterable[PeerService] = ()) -> list[EntrySpec]:
    """Results and partials come only from the switches themselves: a frame from service_ip
    never comes in (own_service), a peer's only on the port toward the peer (peer_service);
    both are WRONG_PORT drops otherwise. Any other source address is not checked."""
    own = EntrySpec.of(
        p4names.SERVICE_SOURCE,
        {"hdr.ipv4.src_addr": ipv4_to_int(service_ip)},
        p4names.OWN_SERVICE,
        {},
    )
    return [own] + [
        EntrySpec.of(
            p4names.SERVICE_SOURCE,
            {"hdr.ipv4.src_addr": ipv4_to_int(p.ip)},
            p4names.PEER_SERVICE,
            {"port": p.port},
        )
        for p in peers
    ]


def forwarding_entries(
    hosts: Iterable[Host],
    service_ip: str,
    switch_mac: str,
    transit: Iterable[Transit] = (),
    peers: Iterable[PeerService] = (),
) -> list[EntrySpec]:
    """Every Forwarding entry of a switch: its hosts, the hosts behind the other switches of
    its tree, its aggregation service address, and the service source addresses (its own,
    and its tree's `peers`)."""
    return (
        [e for h in hosts for e in host_entries(h, switch_mac)]
        + [e for t in transit for e in transit_entries(t, switch_mac)]
        + service_entries(service_ip, switch_mac)
        + service_source_entries(service_ip, peers)
    )
