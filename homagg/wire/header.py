"""The aggregation header, defined once: its fields in wire order with their widths, as
declared by `header agg_h` in p4src/include/headers.p4 (tests/wire/test_header.py
parses the P4 declaration and compares). The numpy dtype of the packer, the struct of
the reference switch and the Scapy layer are all derived from AGG_HEADER_FIELDS."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from homagg.wire.constants import (
    AGG_HEADER_BYTES,
    AGG_VERSION,
    CELLS_PER_PKT,
    CHUNK_BITS,
    JOB_ID_BITS,
    Flag,
)


class HeaderField(NamedTuple):
    """One field of the header: its name (as in P4) and its width in bits."""

    name: str
    bits: int


# Wire order, big-endian; docs/protocol.md says what each field means.
AGG_HEADER_FIELDS: tuple[HeaderField, ...] = (
    HeaderField("version", 8),
    HeaderField("flags", 8),
    HeaderField("op", 8),
    HeaderField("rank", 8),
    HeaderField("job_id", JOB_ID_BITS),
    HeaderField("slot", 16),
    HeaderField("shadow", 8),
    HeaderField("exp", 8),
    HeaderField("ncells", 16),
    HeaderField("chunk", CHUNK_BITS),
)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in AGG_HEADER_FIELDS)

# Every field is a whole number of bytes (checked below), so each maps onto one
# big-endian unsigned integer of numpy and of struct.
_STRUCT_CODES = {8: "B", 16: "H", 32: "I"}

if sum(f.bits for f in AGG_HEADER_FIELDS) != 8 * AGG_HEADER_BYTES:
    raise AssertionError(f"the header fields do not add up to {AGG_HEADER_BYTES} bytes")
if any(f.bits not in _STRUCT_CODES for f in AGG_HEADER_FIELDS):
    raise AssertionError("every header field must be 8, 16 or 32 bits wide")

HEADER_DTYPE = np.dtype([(f.name, f">u{f.bits // 8}") for f in AGG_HEADER_FIELDS])
HEADER_STRUCT = struct.Struct("!" + "".join(_STRUCT_CODES[f.bits] for f in AGG_HEADER_FIELDS))
_DTYPE_FIELDS = HEADER_DTYPE.fields
assert _DTYPE_FIELDS is not None  # a structured dtype
FIELD_OFFSETS: dict[str, int] = {name: _DTYPE_FIELDS[name][1] for name in FIELD_NAMES}


@dataclass(frozen=True)
class AggHeader:
    """One aggregation header (keyword fields; tests check they are AGG_HEADER_FIELDS)."""

    job_id: int
    slot: int
    shadow: int
    rank: int
    op: int
    chunk: int
    ncells: int = CELLS_PER_PKT
    exp: int = 0
    flags: int = 0
    version: int = AGG_VERSION

    def to_record(self) -> np.ndarray:
        """This header as a one-element HEADER_DTYPE array."""
        rec = np.zeros(1, HEADER_DTYPE)
        for name in FIELD_NAMES:
            rec[name] = getattr(self, name)
        return rec

    @classmethod
    def from_record(cls, rec: np.void) -> AggHeader:
        """The header held in one HEADER_DTYPE record."""
        return cls(**{name: int(rec[name]) for name in FIELD_NAMES})


def header_view(payload: np.ndarray) -> np.ndarray:
    """A writable HEADER_DTYPE view of the header(s) of one packed payload (uint8, 1-D)
    or of k payloads (uint8, (k, n)): one element per payload."""
    if payload.dtype != np.uint8 or payload.shape[-1] < AGG_HEADER_BYTES:
        raise ValueError(
            f"expected uint8 payloads of at least {AGG_HEADER_BYTES} bytes, "
            f"got {payload.dtype} {payload.shape}"
        )
    view = payload[..., :AGG_HEADER_BYTES].view(HEADER_DTYPE)
    return view if payload.ndim == 1 else view[..., 0]


def marked_retx(payload: np.ndarray) -> bytes:
    """The same contribution (one packed uint8 payload), marked as a retransmission."""
    out = payload.copy()
    header_view(out)["flags"] |= int(Flag.RETX)
    return out.tobytes()
