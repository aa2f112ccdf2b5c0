"""homagg.lab.aggjob's fast frame parse reads what Scapy's Agg layer reads, and nothing
from frames that are not aggregation packets."""

from __future__ import annotations

import numpy as np
from scapy.layers.l2 import Ether

from homagg.lab.aggjob import agg_frame, result_cells
from homagg.wire.constants import AGG_UDP_PORT, Flag, Op
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import FIELD_NAMES, AggHeader
from homagg.wire.packer import pack_payload
from homagg.wire.scapy_layer import Agg

MACS_IPS = ("02:00:00:00:00:01", "02:00:00:00:00:02", "10.0.0.1", "10.0.0.2")


def test_agg_frame_reads_what_scapy_reads():
    cells = np.resize(np.array([-(1 << 31), -1, 0, 1, (1 << 31) - 1], np.int32), 256)
    header = AggHeader(
        job_id=7, slot=3, shadow=1, rank=5, op=Op.MAX, chunk=9, exp=200, flags=Flag.RESULT
    )
    payload = pack_payload(header, cells)
    for ports in ((AGG_UDP_PORT, 41000), (41000, AGG_UDP_PORT)):  # a result, a contribution
        raw = FrameTemplate(*MACS_IPS, *ports).frame(payload)
        parsed = agg_frame(raw)
        assert parsed is not None
        pkt = Ether(raw)
        assert [getattr(parsed[0], n) for n in FIELD_NAMES] == [
            int(getattr(pkt[Agg], n)) for n in FIELD_NAMES
        ]
        np.testing.assert_array_equal(parsed[1], result_cells(pkt))
        assert agg_frame(raw[:-1]) is None  # short
        assert agg_frame(raw[:12] + b"\x86\xdd" + raw[14:]) is None  # not IPv4
    other_port = FrameTemplate(*MACS_IPS, 41000, 41001).frame(payload)
    assert agg_frame(other_port) is None
