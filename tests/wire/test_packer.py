"""The numpy packer and the Scapy layer agree byte for byte, both ways."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from homagg.wire.constants import AGG_FRAME_BYTES, AGG_UDP_PORT, CELLS_PER_PKT
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import HEADER_DTYPE, AggHeader
from homagg.wire.packer import (
    PAYLOAD_BYTES,
    pack_payload,
    pack_payloads,
    parse_payload,
    parse_payloads,
)
from homagg.wire.scapy_layer import Agg

N_PACKETS = 3000


def random_headers(rng: np.random.Generator, n: int) -> np.ndarray:
    headers = np.zeros(n, HEADER_DTYPE)
    for name in HEADER_DTYPE.names:
        kind = HEADER_DTYPE[name]
        headers[name] = rng.integers(0, 1 << (8 * kind.itemsize), n, dtype=np.uint64)
    return headers


def random_cells(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-(1 << 31), 1 << 31, (n, CELLS_PER_PKT), dtype=np.int64).astype(np.int32)


def scapy_agg(rec: np.void, cells: np.ndarray) -> Agg:
    return Agg(**{name: int(rec[name]) for name in HEADER_DTYPE.names}, cells=cells.tolist())


def test_numpy_and_scapy_produce_identical_bytes():
    rng = np.random.default_rng(0)
    headers, cells = random_headers(rng, N_PACKETS), random_cells(rng, N_PACKETS)
    packed = pack_payloads(headers, cells)
    assert packed.shape == (N_PACKETS, PAYLOAD_BYTES)
    for i in range(N_PACKETS):
        assert packed[i].tobytes() == bytes(scapy_agg(headers[i], cells[i])), f"packet {i}"


def test_each_parses_the_others_output():
    rng = np.random.default_rng(1)
    headers, cells = random_headers(rng, N_PACKETS), random_cells(rng, N_PACKETS)
    blob = b"".join(bytes(scapy_agg(headers[i], cells[i])) for i in range(N_PACKETS))
    got_headers, got_cells = parse_payloads(blob)
    np.testing.assert_array_equal(got_headers, headers)
    np.testing.assert_array_equal(got_cells, cells)
    packed = pack_payloads(headers, cells)
    for i in range(0, N_PACKETS, 7):
        layer = Agg(packed[i].tobytes())
        assert {n: layer.getfieldval(n) for n in HEADER_DTYPE.names} == {
            n: int(headers[i][n]) for n in HEADER_DTYPE.names
        }
        assert layer.cells == cells[i].tolist()


def test_single_packet_round_trip_and_errors():
    header = AggHeader(job_id=7, slot=3, shadow=1, rank=2, op=1, chunk=2**32 - 1, exp=200)
    cells = np.arange(CELLS_PER_PKT, dtype=np.int32) * -3
    parsed_header, parsed_cells = parse_payload(pack_payload(header, cells))
    assert parsed_header == header
    np.testing.assert_array_equal(parsed_cells, cells)
    with pytest.raises(ValueError, match="must be"):
        parse_payload(b"\x01" * 10)
    with pytest.raises(ValueError, match="expected"):
        pack_payload(header, cells[:-1])


def test_payloads_of_a_switchs_own_cell_count_round_trip():
    """A job on a switch whose program takes 64 cells (the TNA build) packs and parses 64,
    whatever the default build is; a count no program has is refused."""
    rng = np.random.default_rng(1)
    headers = random_headers(rng, 3)
    cells = rng.integers(-(1 << 31), 1 << 31, (3, 64), dtype=np.int64).astype(np.int32)
    packed = pack_payloads(headers, cells)
    assert packed.shape == (3, 16 + 4 * 64)
    got_headers, got_cells = parse_payloads(packed.tobytes(), 64)
    np.testing.assert_array_equal(got_headers, headers)
    np.testing.assert_array_equal(got_cells, cells)
    with pytest.raises(ValueError, match="for N in"):
        pack_payloads(headers, np.zeros((3, 100), np.int32))
    with pytest.raises(ValueError, match="not a whole number"):
        parse_payloads(packed[:1].tobytes(), 256)


def test_frame_template_matches_scapy():
    tpl = FrameTemplate("02:00:00:00:00:01", "02:00:00:00:00:fe", "10.0.0.1", "10.0.0.254", 41000)
    payload = pack_payload(
        AggHeader(job_id=1, slot=0, shadow=0, rank=0, op=1, chunk=5),
        np.zeros(CELLS_PER_PKT, np.int32),
    )
    frame = tpl.frame(payload)
    assert len(frame) == AGG_FRAME_BYTES
    pkt = Ether(frame)
    rebuilt = (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:fe")
        / IP(src="10.0.0.1", dst="10.0.0.254", flags="DF", id=0)
        / UDP(sport=41000, dport=AGG_UDP_PORT, chksum=0)
        / Agg(payload)
    )
    assert bytes(rebuilt) == frame
    assert pkt[Agg].chunk == 5
    np.testing.assert_array_equal(
        tpl.frames(np.frombuffer(payload, np.uint8)[None, :])[0], np.frombuffer(frame, np.uint8)
    )
