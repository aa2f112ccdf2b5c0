"""SwitchParser (p4src/parser.p4): Ethernet, ARP or IPv4/UDP, then the aggregation
header and cells on AGG_UDP_PORT. A header that does not fit sets parser_error to
PacketTooShort and stays invalid; the packet still goes to ingress, as on BMv2."""

from __future__ import annotations

import numpy as np

from homagg.refswitch.packet import AggH, Arp, Ethernet, Headers, Ipv4, Udp
from homagg.wire.constants import (
    AGG_UDP_PORT,
    CELLS_PER_PKT,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    IP_PROTO_UDP,
)
from homagg.wire.frame import ARP_STRUCT, ETH_STRUCT, IPV4_IHL, IPV4_STRUCT, UDP_STRUCT, unpack_ipv4
from homagg.wire.header import HEADER_STRUCT
from homagg.wire.packer import CELLS_DTYPE

PACKET_TOO_SHORT = "PacketTooShort"

_CELLS_BYTES = 4 * CELLS_PER_PKT


def _int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def parse(frame: bytes) -> tuple[Headers, str]:
    """Parse one frame into headers; returns (headers, parser_error)."""
    hdr = Headers()
    n = len(frame)
    if n < ETH_STRUCT.size:
        return hdr, PACKET_TOO_SHORT
    dst, src, ether_type = ETH_STRUCT.unpack_from(frame, 0)
    hdr.ethernet = Ethernet(_int(dst), _int(src), ether_type)
    off = ETH_STRUCT.size
    if ether_type == ETHERTYPE_ARP:
        if n < off + ARP_STRUCT.size:
            return hdr, PACKET_TOO_SHORT
        f = ARP_STRUCT.unpack_from(frame, off)
        hdr.arp = Arp(f[0], f[1], f[2], f[3], f[4], _int(f[5]), _int(f[6]), _int(f[7]), _int(f[8]))
        hdr.payload = frame[off + ARP_STRUCT.size :]
        return hdr, "NoError"
    if ether_type != ETHERTYPE_IPV4:
        hdr.payload = frame[off:]
        return hdr, "NoError"
    if n < off + IPV4_STRUCT.size:
        return hdr, PACKET_TOO_SHORT
    hdr.ipv4 = Ipv4(*unpack_ipv4(frame, off))
    off += IPV4_STRUCT.size
    ip = hdr.ipv4
    if not (ip.ihl == IPV4_IHL and ip.frag_offset == 0 and ip.protocol == IP_PROTO_UDP):
        hdr.payload = frame[off:]
        return hdr, "NoError"
    if n < off + UDP_STRUCT.size:
        return hdr, PACKET_TOO_SHORT
    hdr.udp = Udp(*UDP_STRUCT.unpack_from(frame, off))
    off += UDP_STRUCT.size
    if hdr.udp.dst_port != AGG_UDP_PORT:
        hdr.payload = frame[off:]
        return hdr, "NoError"
    if n < off + HEADER_STRUCT.size:
        return hdr, PACKET_TOO_SHORT
    hdr.agg = AggH(*HEADER_STRUCT.unpack_from(frame, off))
    off += HEADER_STRUCT.size
    if n < off + _CELLS_BYTES:
        return hdr, PACKET_TOO_SHORT
    hdr.cells = np.frombuffer(frame, CELLS_DTYPE, CELLS_PER_PKT, off).astype(np.int32)
    hdr.payload = frame[off + _CELLS_BYTES :]
    return hdr, "NoError"
