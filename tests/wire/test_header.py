"""The one definition of the aggregation header agrees with the P4 declaration, and every
form derived from it (numpy dtype, struct, Scapy layer, AggHeader) lays it out alike."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from p4source import header_fields
from scapy.layers.inet import IP

from homagg.wire.constants import AGG_HEADER_BYTES, CELLS_PER_PKT, Flag
from homagg.wire.frame import ipv4_checksum
from homagg.wire.header import (
    AGG_HEADER_FIELDS,
    FIELD_NAMES,
    FIELD_OFFSETS,
    HEADER_DTYPE,
    HEADER_STRUCT,
    AggHeader,
    header_view,
    marked_retx,
)
from homagg.wire.packer import PAYLOAD_BYTES, pack_payload, pack_payloads
from homagg.wire.scapy_layer import Agg


def test_python_header_is_the_p4_declaration():
    """Field names and widths, in order, as `header agg_h` in p4src/include/headers.p4."""
    assert [(f.name, f.bits) for f in AGG_HEADER_FIELDS] == header_fields("agg_h")


def test_the_fields_fill_the_header_bytes_in_order():
    offset = 0
    for f in AGG_HEADER_FIELDS:
        assert FIELD_OFFSETS[f.name] == offset, f.name
        offset += f.bits // 8
    assert offset == AGG_HEADER_BYTES == HEADER_DTYPE.itemsize == HEADER_STRUCT.size


def test_numpy_dtype_is_the_table():
    assert HEADER_DTYPE.names == FIELD_NAMES
    for f in AGG_HEADER_FIELDS:
        kind, offset = HEADER_DTYPE.fields[f.name][:2]
        assert (kind.kind, kind.itemsize * 8, offset) == ("u", f.bits, FIELD_OFFSETS[f.name])
        assert kind.byteorder in (">", "|"), f"{f.name} is not big-endian"


def test_scapy_layer_is_the_table():
    header_fields_desc = Agg.fields_desc[: len(AGG_HEADER_FIELDS)]
    assert [(fld.name, int(fld.sz * 8)) for fld in header_fields_desc] == [
        (f.name, f.bits) for f in AGG_HEADER_FIELDS
    ]
    assert [fld.name for fld in Agg.fields_desc[len(AGG_HEADER_FIELDS) :]] == ["cells"]


def test_agg_header_has_exactly_the_table_fields():
    assert {f.name for f in dataclasses.fields(AggHeader)} == set(FIELD_NAMES)


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_each_field_lands_on_the_same_bytes_in_every_form(name):
    """One field at its maximum (a distinct byte pattern), the others zero: the numpy,
    struct and Scapy encodings agree, and the value sits at the field's offset."""
    bits = dict(AGG_HEADER_FIELDS)[name]
    value = int.from_bytes(bytes(range(0xA1, 0xA1 + bits // 8)), "big")
    values = {n: (value if n == name else 0) for n in FIELD_NAMES}
    rec = np.zeros(1, HEADER_DTYPE)
    rec[name] = value
    via_numpy = rec.tobytes()
    via_struct = HEADER_STRUCT.pack(*(values[n] for n in FIELD_NAMES))
    via_scapy = bytes(Agg(**values, cells=[0] * CELLS_PER_PKT))[:AGG_HEADER_BYTES]
    via_dataclass = AggHeader(**values).to_record().tobytes()
    assert via_numpy == via_struct == via_scapy == via_dataclass
    start = FIELD_OFFSETS[name]
    assert via_numpy[start : start + bits // 8] == value.to_bytes(bits // 8, "big")
    assert via_numpy.count(0) == AGG_HEADER_BYTES - bits // 8


def test_header_view_sets_the_retransmission_flag_in_place():
    header = AggHeader(job_id=9, slot=1, shadow=1, rank=3, op=1, chunk=2**32 - 1, flags=0)
    one = np.frombuffer(pack_payload(header, np.zeros(CELLS_PER_PKT, np.int32)), np.uint8).copy()
    header_view(one)["flags"] |= int(Flag.RETX)
    assert Agg(one.tobytes()).flags == Flag.RETX
    resent = AggHeader.from_record(header_view(one)[0])
    assert resent == dataclasses.replace(header, flags=Flag.RETX)
    batch = pack_payloads(
        np.concatenate([header.to_record()] * 3), np.zeros((3, CELLS_PER_PKT), np.int32)
    )
    header_view(batch)[1:]["flags"] |= int(Flag.RESULT)
    assert [int(Agg(row.tobytes()).flags) for row in batch] == [0, Flag.RESULT, Flag.RESULT]
    assert batch.shape == (3, PAYLOAD_BYTES)
    with pytest.raises(ValueError, match="uint8"):
        header_view(np.zeros(AGG_HEADER_BYTES, np.int32))
    with pytest.raises(ValueError, match="at least"):
        header_view(np.zeros(AGG_HEADER_BYTES - 1, np.uint8))


def test_marked_retx_is_a_marked_copy():
    header = AggHeader(job_id=9, slot=1, shadow=1, rank=3, op=1, chunk=7, flags=0)
    cells = np.arange(CELLS_PER_PKT, dtype=np.int32)
    payload = np.frombuffer(pack_payload(header, cells), np.uint8).copy()
    before = payload.copy()
    resent = marked_retx(payload)
    np.testing.assert_array_equal(payload, before)  # the original is not marked
    assert resent[AGG_HEADER_BYTES:] == before[AGG_HEADER_BYTES:].tobytes()
    again = AggHeader.from_record(header_view(np.frombuffer(resent, np.uint8))[0])
    assert again == dataclasses.replace(header, flags=Flag.RETX)


def test_ipv4_checksum_is_scapys():
    rng = np.random.default_rng(5)
    for _ in range(200):
        pkt = IP(
            src=".".join(map(str, rng.integers(0, 256, 4))),
            dst="10.0.0.254",
            ttl=int(rng.integers(1, 256)),
            id=int(rng.integers(0, 1 << 16)),
            len=int(rng.integers(20, 1 << 16)),
            proto=17,
            chksum=0,
        )
        raw = bytes(pkt)[:20]  # checksum field zero
        rebuilt = IP(raw)
        del rebuilt.chksum  # Scapy computes it
        assert ipv4_checksum(raw) == IP(bytes(rebuilt)).chksum
    header = bytearray(bytes(IP(src="10.0.0.1", dst="10.0.0.2", chksum=0))[:20])
    struct.pack_into("!H", header, 10, ipv4_checksum(bytes(header)))
    assert ipv4_checksum(bytes(header)) == 0, "a header with its checksum sums to zero"
    with pytest.raises(ValueError, match="20 bytes"):
        ipv4_checksum(bytes(header) + b"\x00\x00\x00\x00")
