"""SwitchDeparser and SwitchComputeChecksum (p4src/deparser.p4): emit the valid headers
in order, then the payload; the IPv4 checksum is recomputed for every IPv4 packet."""

from __future__ import annotations

from operator import attrgetter

from homagg.refswitch.packet import Headers
from homagg.wire.frame import ARP_STRUCT, ETH_STRUCT, UDP_STRUCT, ipv4_checksum, pack_ipv4
from homagg.wire.header import FIELD_NAMES, HEADER_STRUCT
from homagg.wire.packer import CELLS_DTYPE

_agg_fields = attrgetter(*FIELD_NAMES)  # agg_h's field values in wire order, as a tuple


def _ipv4_bytes(hdr: Headers, checksum: int) -> bytes:
    ip = hdr.ipv4
    assert ip is not None
    return pack_ipv4(
        ip.version,
        ip.ihl,
        ip.diffserv,
        ip.total_len,
        ip.identification,
        ip.flags,
        ip.frag_offset,
        ip.ttl,
        ip.protocol,
        checksum,
        ip.src_addr,
        ip.dst_addr,
    )


def compute_checksum(hdr: Headers) -> None:
    """update_checksum(hdr.ipv4.isValid(), ..., csum16) over the header, checksum zero."""
    if hdr.ipv4 is not None:
        hdr.ipv4.hdr_checksum = ipv4_checksum(_ipv4_bytes(hdr, 0))


def deparse(hdr: Headers) -> bytes:
    """The frame the switch transmits."""
    parts = []
    if hdr.ethernet is not None:
        e = hdr.ethernet
        parts.append(
            ETH_STRUCT.pack(
                e.dst_addr.to_bytes(6, "big"), e.src_addr.to_bytes(6, "big"), e.ether_type
            )
        )
    if hdr.arp is not None:
        a = hdr.arp
        parts.append(
            ARP_STRUCT.pack(
                a.htype,
                a.ptype,
                a.hlen,
                a.plen,
                a.oper,
                a.sha.to_bytes(6, "big"),
                a.spa.to_bytes(4, "big"),
                a.tha.to_bytes(6, "big"),
                a.tpa.to_bytes(4, "big"),
            )
        )
    if hdr.ipv4 is not None:
        parts.append(_ipv4_bytes(hdr, hdr.ipv4.hdr_checksum))
    if hdr.udp is not None:
        u = hdr.udp
        parts.append(UDP_STRUCT.pack(u.src_port, u.dst_port, u.length, u.checksum))
    if hdr.agg is not None:
        parts.append(HEADER_STRUCT.pack(*_agg_fields(hdr.agg)))
    if hdr.cells is not None:
        parts.append(hdr.cells.astype(CELLS_DTYPE).tobytes())
    parts.append(hdr.payload)
    return b"".join(parts)
