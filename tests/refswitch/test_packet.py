"""The reference switch's agg_h is the one header definition: same fields in wire order,
parsed and deparsed through the struct derived from it."""

from __future__ import annotations

import dataclasses

import numpy as np

from homagg.refswitch.deparser import compute_checksum, deparse
from homagg.refswitch.packet import AggH
from homagg.refswitch.parser import parse
from homagg.wire.constants import CELLS_PER_PKT
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import FIELD_NAMES, AggHeader
from homagg.wire.packer import pack_payload


def test_agg_h_has_the_header_fields_in_wire_order():
    assert tuple(f.name for f in dataclasses.fields(AggH)) == FIELD_NAMES


def test_parse_then_deparse_gives_the_frame_back():
    header = AggHeader(
        job_id=0xFFFF,
        slot=0xFFFE,
        shadow=1,
        rank=31,
        op=3,
        chunk=2**32 - 1,
        ncells=CELLS_PER_PKT - 1,
        exp=0xFE,
        flags=0x02,
        version=1,
    )
    cells = np.arange(CELLS_PER_PKT, dtype=np.int32) * -65537
    frame = FrameTemplate(
        "02:00:00:00:00:01", "02:00:00:00:00:fe", "10.0.0.1", "10.0.0.254", 41000
    ).frame(pack_payload(header, cells))
    hdr, error = parse(frame)
    assert error == "NoError"
    assert {n: getattr(hdr.agg, n) for n in FIELD_NAMES} == dataclasses.asdict(header)
    np.testing.assert_array_equal(hdr.cells, cells)
    checksum = hdr.ipv4.hdr_checksum
    compute_checksum(hdr)
    assert hdr.ipv4.hdr_checksum == checksum, "the one ipv4_checksum agrees with itself"
    assert deparse(hdr) == frame
