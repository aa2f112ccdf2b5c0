"""Vectorized packing and parsing of aggregation packets with numpy (the hot path).

One structured dtype (homagg.wire.header.HEADER_DTYPE) describes the 16-byte header; a batch
of k packets is one (k, 16 + 4N) uint8 array, so packing costs a few array copies, never a
Python loop over cells. tests/wire/test_packer.py proves it byte-identical to the Scapy layer.
The Ethernet/IPv4/UDP prefix before a payload is homagg.wire.frame's.
"""

from __future__ import annotations

import numpy as np

from homagg.wire.constants import AGG_HEADER_BYTES, CELLS_CHOICES, CELLS_PER_PKT
from homagg.wire.header import HEADER_DTYPE, AggHeader

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
