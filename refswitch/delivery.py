"""ResultDelivery (p4src/delivery.p4): each copy of a result leaves as a unicast UDP
datagram from the service address to one worker; replicas carry rank + 1 in egress_rid."""

from __future__ import annotations

from aggwire import p4names
from aggwire.constants import AGG_UDP_PORT, RESULT_TTL, DropReason
from refswitch.device import Device
from refswitch.packet import Headers, Metadata, StandardMetadata


def result_delivery(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """ResultDelivery.apply()."""
    if std.egress_rid != 0:
        hdr.agg.rank = (std.egress_rid - 1) & 0xFF
    _, action, params = device.table(p4names.RESULT_REWRITE).lookup(
        (hdr.agg.job_id, hdr.agg.rank), std.packet_length
    )
    if action == p4names.TO_WORKER:
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr
        hdr.ethernet.dst_addr = params["mac"]
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr
        hdr.ipv4.dst_addr = params["ip"]
        hdr.ipv4.ttl = RESULT_TTL
        hdr.udp.src_port = AGG_UDP_PORT
        hdr.udp.dst_port = params["udp_port"]
        hdr.udp.checksum = 0
    else:
        meta.drop_reason = DropReason.NO_RECIPIENT
