"""ResultDelivery (p4src/delivery.p4): each copy of a result leaves as a unicast UDP
datagram from the service address to one worker; replicas carry rank + 1 in egress_rid."""

from __future__ import annotations

from homagg.refswitch.device import Device
from homagg.refswitch.packet import Headers, Metadata, StandardMetadata
from homagg.wire import p4names
from homagg.wire.constants import AGG_UDP_PORT, RESULT_TTL, DropReason


def result_delivery(device: Device, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
    """ResultDelivery.apply(); only the results the aggregation emitted reach it (to_delivery),
    so every header up to agg_h is valid."""
    eth, ip, udp, agg = hdr.ethernet, hdr.ipv4, hdr.udp, hdr.agg
    assert eth is not None and ip is not None and udp is not None and agg is not None
    if std.egress_rid != 0:
        agg.rank = (std.egress_rid - 1) & 0xFF
    _, action, params = device.table(p4names.RESULT_REWRITE).lookup(
        (agg.job_id, agg.rank), std.packet_length
    )
    if action == p4names.TO_WORKER:
        eth.src_addr = eth.dst_addr
        eth.dst_addr = params["mac"]
        ip.src_addr = ip.dst_addr
        ip.dst_addr = params["ip"]
        ip.ttl = RESULT_TTL
        udp.src_port = AGG_UDP_PORT
        udp.dst_port = params["udp_port"]
        udp.checksum = 0
    else:
        meta.drop_reason = DropReason.NO_RECIPIENT
