"""SwitchDeparser and SwitchComputeChecksum (p4src/deparser.p4): emit the valid headers
in order, then the payload; the IPv4 checksum is recomputed for every IPv4 packet."""

from __future__ import annotations

import struct

from refswitch.packet import AGG_STRUCT, ARP_STRUCT, CELLS_DTYPE, ETH_STRUCT, IPV4_STRUCT, UDP_STRUCT, Headers


def ipv4_checksum(raw: bytes) -> int:
    """csum16 over a 20-byte IPv4 header whose checksum field is zero."""
    total = sum(struct.unpack("!10H", raw))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ipv4_bytes(hdr: Headers, checksum: int) -> bytes:
    ip = hdr.ipv4
    return IPV4_STRUCT.pack((ip.version << 4) | ip.ihl, ip.diffserv, ip.total_len, ip.identification,
                      (ip.flags << 13) | ip.frag_offset, ip.ttl, ip.protocol, checksum,
                      ip.src_addr.to_bytes(4, "big"), ip.dst_addr.to_bytes(4, "big"))


def compute_checksum(hdr: Headers) -> None:
    """update_checksum(hdr.ipv4.isValid(), ..., csum16)."""
    if hdr.ipv4 is not None:
        hdr.ipv4.hdr_checksum = ipv4_checksum(_ipv4_bytes(hdr, 0))


def deparse(hdr: Headers) -> bytes:
    """The frame the switch transmits."""
    parts = []
    if hdr.ethernet is not None:
        e = hdr.ethernet
        parts.append(ETH_STRUCT.pack(e.dst_addr.to_bytes(6, "big"), e.src_addr.to_bytes(6, "big"),
                               e.ether_type))
    if hdr.arp is not None:
        a = hdr.arp
        parts.append(ARP_STRUCT.pack(a.htype, a.ptype, a.hlen, a.plen, a.oper, a.sha.to_bytes(6, "big"),
                               a.spa.to_bytes(4, "big"), a.tha.to_bytes(6, "big"),
                               a.tpa.to_bytes(4, "big")))
    if hdr.ipv4 is not None:
        parts.append(_ipv4_bytes(hdr, hdr.ipv4.hdr_checksum))
    if hdr.udp is not None:
        u = hdr.udp
        parts.append(UDP_STRUCT.pack(u.src_port, u.dst_port, u.length, u.checksum))
    if hdr.agg is not None:
        g = hdr.agg
        parts.append(AGG_STRUCT.pack(g.version, g.flags, g.op, g.rank, g.job_id, g.slot, g.shadow, g.exp,
                               g.ncells, g.chunk))
    if hdr.cells is not None:
        parts.append(hdr.cells.astype(CELLS_DTYPE).tobytes())
    parts.append(hdr.payload)
    return b"".join(parts)
