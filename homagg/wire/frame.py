"""The Ethernet, ARP, IPv4 and UDP headers around the aggregation header, defined once:
their wire layouts (big-endian, as p4src/include/headers.p4 declares them and the P4
parser extracts them), the IPv4 checksum, and FrameTemplate, the fixed prefix a host puts
before every aggregation payload. The reference switch parses and emits frames with
these layouts; the codes they carry are in homagg.wire.constants (checked against the P4
program)."""

from __future__ import annotations

import ipaddress
import struct

import numpy as np

from homagg.wire.constants import (
    AGG_IPV4_LENGTH,
    AGG_UDP_LENGTH,
    AGG_UDP_PORT,
    ETH_HEADER_BYTES,
    ETHERTYPE_IPV4,
    IP_PROTO_UDP,
    IPV4_HEADER_BYTES,
    UDP_HEADER_BYTES,
)

ETH_STRUCT = struct.Struct("!6s6sH")  # dst, src, ether_type
ARP_STRUCT = struct.Struct("!HHBBH6s4s6s4s")  # htype .. tpa
# version:4 ihl:4, diffserv, total_len, identification, flags:3 frag_offset:13, ttl,
# protocol, hdr_checksum, src_addr, dst_addr
IPV4_STRUCT = struct.Struct("!BBHHHBBH4s4s")
UDP_STRUCT = struct.Struct("!HHHH")  # src_port, dst_port, length, checksum
# agg_h and the cells: homagg.wire.header.HEADER_STRUCT and homagg.wire.packer.CELLS_DTYPE.

if (ETH_STRUCT.size, IPV4_STRUCT.size, UDP_STRUCT.size) != (
    ETH_HEADER_BYTES,
    IPV4_HEADER_BYTES,
    UDP_HEADER_BYTES,
):
    raise AssertionError("the header layouts disagree with homagg.wire.constants' sizes")

IPV4_VERSION = 4
IPV4_IHL = IPV4_HEADER_BYTES // 4  # header length in 32-bit words: 5, no options
IPV4_FRAG_OFFSET_BITS = 13  # the low bits of the flags:3 frag_offset:13 word
IPV4_FLAG_DONT_FRAGMENT = 0b010
# A host's packets start with Linux's default TTL (net.ipv4.ip_default_ttl); the
# switch's results carry homagg.wire.constants.RESULT_TTL.
HOST_TTL = 64
# The largest IPv4 packet (its total length is 16 bits): a read of this many bytes takes
# any datagram whole.
MAX_DATAGRAM_BYTES = (1 << 16) - 1

_IPV4_WORDS = struct.Struct(f"!{IPV4_HEADER_BYTES // 2}H")


def pack_ipv4(
    version: int,
    ihl: int,
    diffserv: int,
    total_len: int,
    identification: int,
    flags: int,
    frag_offset: int,
    ttl: int,
    protocol: int,
    hdr_checksum: int,
    src_addr: int,
    dst_addr: int,
) -> bytes:
    """The 20 bytes of an IPv4 header from ipv4_t's fields (P4's order, addresses as ints)."""
    return IPV4_STRUCT.pack(
        (version << 4) | ihl,
        diffserv,
        total_len,
        identification,
        (flags << IPV4_FRAG_OFFSET_BITS) | frag_offset,
        ttl,
        protocol,
        hdr_checksum,
        src_addr.to_bytes(4, "big"),
        dst_addr.to_bytes(4, "big"),
    )


def unpack_ipv4(buf: bytes, offset: int) -> tuple[int, ...]:
    """ipv4_t's fields (pack_ipv4's arguments) of the IPv4 header at buf[offset:]."""
    f = IPV4_STRUCT.unpack_from(buf, offset)
    return (
        f[0] >> 4,
        f[0] & 0xF,
        f[1],
        f[2],
        f[3],
        f[4] >> IPV4_FRAG_OFFSET_BITS,
        f[4] & ((1 << IPV4_FRAG_OFFSET_BITS) - 1),
        f[5],
        f[6],
        f[7],
        int.from_bytes(f[8], "big"),
        int.from_bytes(f[9], "big"),
    )


def ipv4_checksum(header: bytes) -> int:
    """The Internet checksum (RFC 1071) of a 20-byte IPv4 header whose checksum field is
    zero; the reference switch's deparser uses it too (P4's csum16)."""
    if len(header) != _IPV4_WORDS.size:
        raise ValueError(
            f"an IPv4 header without options has {IPV4_HEADER_BYTES} bytes, not {len(header)}"
        )
    total = sum(_IPV4_WORDS.unpack(header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def mac_bytes(mac: str) -> bytes:
    """'aa:bb:cc:dd:ee:ff' as 6 bytes."""
    return bytes(int(part, 16) for part in mac.split(":"))


class FrameTemplate:
    """Ethernet/IPv4/UDP prefix for aggregation packets between two fixed endpoints.

    Every aggregation packet has the same length, so the prefix (checksum included)
    is computed once and a frame is prefix + payload.
    """

    def __init__(
        self,
        src_mac: str,
        dst_mac: str,
        src_ip: str,
        dst_ip: str,
        src_port: int,
        dst_port: int = AGG_UDP_PORT,
        ttl: int = HOST_TTL,
    ) -> None:
        src, dst = int(ipaddress.IPv4Address(src_ip)), int(ipaddress.IPv4Address(dst_ip))

        def ipv4(checksum: int) -> bytes:  # no options, not fragmented
            return pack_ipv4(
                IPV4_VERSION,
                IPV4_IHL,
                0,
                AGG_IPV4_LENGTH,
                0,
                IPV4_FLAG_DONT_FRAGMENT,
                0,
                ttl,
                IP_PROTO_UDP,
                checksum,
                src,
                dst,
            )

        self.prefix = (
            ETH_STRUCT.pack(mac_bytes(dst_mac), mac_bytes(src_mac), ETHERTYPE_IPV4)
            + ipv4(ipv4_checksum(ipv4(0)))
            + UDP_STRUCT.pack(src_port, dst_port, AGG_UDP_LENGTH, 0)
        )

    def frame(self, payload: bytes) -> bytes:
        """One Ethernet frame carrying payload."""
        return self.prefix + payload

    def frames(self, payloads: np.ndarray) -> np.ndarray:
        """k frames as a (k, len(prefix) + PAYLOAD_BYTES) array from k packed payloads."""
        out = np.empty((payloads.shape[0], len(self.prefix) + payloads.shape[1]), np.uint8)
        out[:, : len(self.prefix)] = np.frombuffer(self.prefix, np.uint8)
        out[:, len(self.prefix) :] = payloads
        return out
