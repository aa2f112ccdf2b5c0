"""Entries of the Forwarding control (p4src/forwarding.p4): proxy ARP and IPv4 routes."""

from __future__ import annotations

from dataclasses import dataclass

from aggwire import p4names
from controller.entries import EntrySpec
from controller.switch_connection import SwitchConnection
from p4rtproto.bytestrings import ipv4_to_int, mac_to_int


@dataclass(frozen=True)
class Host:
    """A host attached to a switch port, and the addresses the switch rewrites to reach it."""

    ip: str
    mac: str
    port: int


def add_host(conn: SwitchConnection, host: Host, switch_mac: str) -> None:
    """Answer ARP for the host with the switch's MAC and route its /32 to its port."""
    conn.insert_entry(p4names.ARP_RESPONDER, {"hdr.arp.tpa": ipv4_to_int(host.ip)},
                      p4names.ARP_REPLY, {"mac": mac_to_int(switch_mac)})
    conn.insert_entry(p4names.IPV4_LPM, {"hdr.ipv4.dst_addr": (ipv4_to_int(host.ip), 32)},
                      p4names.ROUTE, {"port": host.port, "src_mac": mac_to_int(switch_mac),
                                      "dst_mac": mac_to_int(host.mac)})


def add_service_address(conn: SwitchConnection, service_ip: str, switch_mac: str) -> None:
    """Make service_ip the aggregation address: ARP answered, packets to it aggregated."""
    conn.insert_entry(p4names.ARP_RESPONDER, {"hdr.arp.tpa": ipv4_to_int(service_ip)},
                      p4names.ARP_REPLY, {"mac": mac_to_int(switch_mac)})
    conn.insert_entry(p4names.IPV4_LPM, {"hdr.ipv4.dst_addr": (ipv4_to_int(service_ip), 32)},
                      p4names.AGGREGATE, {})


def host_entries(host: Host, switch_mac: str) -> list[EntrySpec]:
    """The entries add_host installs (proxy ARP, /32 route), as values."""
    return [EntrySpec.of(p4names.ARP_RESPONDER, {"hdr.arp.tpa": ipv4_to_int(host.ip)},
                         p4names.ARP_REPLY, {"mac": mac_to_int(switch_mac)}),
            EntrySpec.of(p4names.IPV4_LPM, {"hdr.ipv4.dst_addr": (ipv4_to_int(host.ip), 32)},
                         p4names.ROUTE, {"port": host.port, "src_mac": mac_to_int(switch_mac),
                                         "dst_mac": mac_to_int(host.mac)})]


def service_entries(service_ip: str, switch_mac: str) -> list[EntrySpec]:
    """The entries add_service_address installs, as values."""
    return [EntrySpec.of(p4names.ARP_RESPONDER, {"hdr.arp.tpa": ipv4_to_int(service_ip)},
                         p4names.ARP_REPLY, {"mac": mac_to_int(switch_mac)}),
            EntrySpec.of(p4names.IPV4_LPM, {"hdr.ipv4.dst_addr": (ipv4_to_int(service_ip), 32)},
                         p4names.AGGREGATE, {})]


def remove_host(conn: SwitchConnection, host: Host) -> None:
    """Undo add_host: the host's route first, then its proxy ARP entry."""
    conn.delete_entry(p4names.IPV4_LPM, {"hdr.ipv4.dst_addr": (ipv4_to_int(host.ip), 32)})
    conn.delete_entry(p4names.ARP_RESPONDER, {"hdr.arp.tpa": ipv4_to_int(host.ip)})
