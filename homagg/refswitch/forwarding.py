"""Forwarding (p4src/forwarding.p4): proxy ARP for the addresses the controller knows, the
check of service source addresses, IPv4 LPM routing with static neighbor rewriting,
hand-off to aggregation."""

from __future__ import annotations

from homagg.refswitch.device import Device
from homagg.refswitch.packet import Headers, Metadata, StandardMetadata
from homagg.wire import p4names
from homagg.wire.constants import (
    ARP_HTYPE_ETHERNET,
    ARP_OPER_REPLY,
    ARP_OPER_REQUEST,
    ETHERTYPE_IPV4,
    DropReason,
)
from homagg.wire.frame import IPV4_IHL


def forwarding(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """Forwarding.apply(); ARP and IPv4 are only parsed after Ethernet."""
    if hdr.arp is not None:
        _arp(device, hdr, meta, std)
    elif hdr.ipv4 is not None:
        _ipv4(device, hdr, meta, std)
    else:
        meta.drop_reason = DropReason.UNSUPPORTED


def _arp(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """Proxy ARP: a request for an address in arp_responder is answered on its port."""
    eth, arp = hdr.ethernet, hdr.arp
    assert eth is not None and arp is not None
    if not (
        arp.oper == ARP_OPER_REQUEST
        and arp.htype == ARP_HTYPE_ETHERNET
        and arp.ptype == ETHERTYPE_IPV4
        and arp.hlen == 6
        and arp.plen == 4
    ):
        meta.drop_reason = DropReason.UNSUPPORTED
        return
    _, action, params = device.table(p4names.ARP_RESPONDER).lookup((arp.tpa,), std.packet_length)
    if action != p4names.ARP_REPLY:
        meta.drop_reason = DropReason.NO_ROUTE
        return
    mac = params["mac"]
    target = arp.tpa
    arp.oper = ARP_OPER_REPLY
    arp.tha = arp.sha
    arp.tpa = arp.spa
    arp.sha = mac
    arp.spa = target
    eth.dst_addr = eth.src_addr
    eth.src_addr = mac
    std.egress_spec = std.ingress_port


def _source_allowed(device: Device, src_addr: int, std: StandardMetadata) -> bool:
    """service_source: the switch's own service address never comes in from outside; another
    switch's of the tree only on the port toward that switch; any other source passes."""
    _, action, params = device.table(p4names.SERVICE_SOURCE).lookup((src_addr,), std.packet_length)
    if action == p4names.OWN_SERVICE:
        return False
    if action == p4names.PEER_SERVICE:
        return bool(std.ingress_port == params["port"])
    return True


def _ipv4(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """ipv4_lpm: route with a static neighbor rewrite, or hand the packet to aggregation."""
    eth, ip = hdr.ethernet, hdr.ipv4
    assert eth is not None and ip is not None
    if ip.ihl != IPV4_IHL:
        meta.drop_reason = DropReason.UNSUPPORTED
    elif ip.ttl <= 1:
        meta.drop_reason = DropReason.TTL_EXPIRED
    elif not _source_allowed(device, ip.src_addr, std):
        meta.drop_reason = DropReason.WRONG_PORT
    else:
        _, action, params = device.table(p4names.IPV4_LPM).lookup((ip.dst_addr,), std.packet_length)
        if action == p4names.ROUTE:
            std.egress_spec = params["port"]
            eth.src_addr = params["src_mac"]
            eth.dst_addr = params["dst_mac"]
            ip.ttl = (ip.ttl - 1) & 0xFF
        elif action == p4names.AGGREGATE:
            meta.to_aggregation = 1
        else:
            meta.drop_reason = DropReason.NO_ROUTE
