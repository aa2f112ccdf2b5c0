"""Forwarding (p4src/forwarding.p4): proxy ARP for the addresses the controller knows,
IPv4 LPM routing with static neighbor rewriting, hand-off to aggregation."""

from __future__ import annotations

from aggwire import p4names
from aggwire.constants import (
    ARP_HTYPE_ETHERNET,
    ARP_OPER_REPLY,
    ARP_OPER_REQUEST,
    ETHERTYPE_IPV4,
    DropReason,
)
from aggwire.frame import IPV4_IHL
from refswitch.device import Device
from refswitch.packet import Headers, Metadata, StandardMetadata


def forwarding(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """Forwarding.apply(); ARP and IPv4 are only parsed after Ethernet."""
    eth = hdr.ethernet
    if hdr.arp is not None:
        assert eth is not None
        arp = hdr.arp
        if (
            arp.oper == ARP_OPER_REQUEST
            and arp.htype == ARP_HTYPE_ETHERNET
            and arp.ptype == ETHERTYPE_IPV4
            and arp.hlen == 6
            and arp.plen == 4
        ):
            _, action, params = device.table(p4names.ARP_RESPONDER).lookup(
                (arp.tpa,), std.packet_length
            )
            if action == p4names.ARP_REPLY:
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
            else:
                meta.drop_reason = DropReason.NO_ROUTE
        else:
            meta.drop_reason = DropReason.UNSUPPORTED
    elif hdr.ipv4 is not None:
        assert eth is not None
        ip = hdr.ipv4
        if ip.ihl != IPV4_IHL:
            meta.drop_reason = DropReason.UNSUPPORTED
        elif ip.ttl <= 1:
            meta.drop_reason = DropReason.TTL_EXPIRED
        else:
            _, action, params = device.table(p4names.IPV4_LPM).lookup(
                (ip.dst_addr,), std.packet_length
            )
            if action == p4names.ROUTE:
                std.egress_spec = params["port"]
                eth.src_addr = params["src_mac"]
                eth.dst_addr = params["dst_mac"]
                ip.ttl = (ip.ttl - 1) & 0xFF
            elif action == p4names.AGGREGATE:
                meta.to_aggregation = 1
            else:
                meta.drop_reason = DropReason.NO_ROUTE
    else:
        meta.drop_reason = DropReason.UNSUPPORTED
