"""Vectorized packing and parsing of aggregation packets with numpy (the hot path).

One structured dtype (aggwire.header.HEADER_DTYPE) describes the 16-byte header; a batch
of k packets is one (k, 16 + 4N) uint8 array, so packing costs a few array copies, never a
Python loop over cells. tests/aggwire/test_packer.py proves it byte-identical to the Scapy layer.
"""

from __future__ import annotations

import ipaddress
import struct

import numpy as np

from aggwire.constants import (
    AGG_HEADER_BYTES,
    AGG_IPV4_LENGTH,
    AGG_UDP_LENGTH,
    AGG_UDP_PORT,
    CELLS_CHOICES,
    CELLS_PER_PKT,
)
from aggwire.header import HEADER_DTYPE, AggHeader

CELLS_DTYPE = np.dtype(">i4")


def payload_bytes(cells_per_packet: int = CELLS_PER_PKT) -> int:
    """The UDP payload of an aggregation packet: its header and cells."""
    return AGG_HEADER_BYTES + 4 * cells_per_packet


PAYLOAD_BYTES = payload_bytes()


def pack_payloads(headers: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Pack k headers (HEADER_DTYPE) and k x N int32 cells (N: the job's cells per packet,
    one of CELLS_CHOICES) into a (k, 16 + 4N) array."""
    cells = np.asarray(cells)
    if cells.ndim != 2 or cells.shape[0] != len(headers) or cells.shape[1] not in CELLS_CHOICES:
        raise ValueError(
            f"cells must be ({len(headers)}, N) for N in {CELLS_CHOICES}, got {cells.shape}"
        )
    n = cells.shape[1]
    out = np.empty((len(headers), payload_bytes(n)), np.uint8)
    out[:, :AGG_HEADER_BYTES] = (
        np.ascontiguousarray(headers, HEADER_DTYPE)
        .view(np.uint8)
        .reshape(len(headers), AGG_HEADER_BYTES)
    )
    out[:, AGG_HEADER_BYTES:] = (
        cells.astype(CELLS_DTYPE, copy=False).view(np.uint8).reshape(len(headers), 4 * n)
    )
    return out


def pack_payload(header: AggHeader, cells: np.ndarray) -> bytes:
    """The UDP payload of one packet: header then N big-endian int32 cells."""
    cells = np.asarray(cells)
    if cells.shape != (CELLS_PER_PKT,):
        raise ValueError(f"expected {CELLS_PER_PKT} cells, got shape {cells.shape}")
    return pack_payloads(header.to_record(), cells.reshape(1, -1))[0].tobytes()


def parse_payloads(
    buf: bytes | bytearray | memoryview | np.ndarray, cells_per_packet: int = CELLS_PER_PKT
) -> tuple[np.ndarray, np.ndarray]:
    """Split k concatenated payloads into (headers as HEADER_DTYPE, cells as int32 (k, N))."""
    raw = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1)
    size = payload_bytes(cells_per_packet)
    if raw.size % size:
        raise ValueError(f"{raw.size} bytes is not a whole number of {size}-byte payloads")
    rows = raw.reshape(-1, size)
    headers = np.ascontiguousarray(rows[:, :AGG_HEADER_BYTES]).view(HEADER_DTYPE).reshape(-1)
    cells = np.ascontiguousarray(rows[:, AGG_HEADER_BYTES:]).view(CELLS_DTYPE).astype(np.int32)
    return headers, cells


def parse_payload(data: bytes) -> tuple[AggHeader, np.ndarray]:
    """Parse one UDP payload; raises ValueError when its length is not exactly one packet."""
    if len(data) != PAYLOAD_BYTES:
        raise ValueError(f"aggregation payload must be {PAYLOAD_BYTES} bytes, got {len(data)}")
    headers, cells = parse_payloads(data)
    return AggHeader.from_record(headers[0]), cells[0]


_IPV4_WORDS = struct.Struct("!10H")  # an IPv4 header without options (the only kind used)


def ipv4_checksum(header: bytes) -> int:
    """The Internet checksum (RFC 1071) of a 20-byte IPv4 header whose checksum field is
    zero; the reference switch's deparser uses it too (P4's csum16)."""
    if len(header) != _IPV4_WORDS.size:
        raise ValueError(f"an IPv4 header without options has 20 bytes, not {len(header)}")
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
        ttl: int = 64,
    ) -> None:
        ip = bytearray(
            struct.pack(
                "!BBHHHBBH4s4s",
                0x45,
                0,
                AGG_IPV4_LENGTH,
                0,
                0x4000,
                ttl,
                17,
                0,
                ipaddress.IPv4Address(src_ip).packed,
                ipaddress.IPv4Address(dst_ip).packed,
            )
        )
        struct.pack_into("!H", ip, 10, ipv4_checksum(bytes(ip)))
        udp = struct.pack("!HHHH", src_port, dst_port, AGG_UDP_LENGTH, 0)
        self.prefix = mac_bytes(dst_mac) + mac_bytes(src_mac) + b"\x08\x00" + bytes(ip) + udp

    def frame(self, payload: bytes) -> bytes:
        """One Ethernet frame carrying payload."""
        return self.prefix + payload

    def frames(self, payloads: np.ndarray) -> np.ndarray:
        """k frames as a (k, len(prefix) + PAYLOAD_BYTES) array from k packed payloads."""
        out = np.empty((payloads.shape[0], len(self.prefix) + payloads.shape[1]), np.uint8)
        out[:, : len(self.prefix)] = np.frombuffer(self.prefix, np.uint8)
        out[:, len(self.prefix) :] = payloads
        return out
