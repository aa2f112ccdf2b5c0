"""The headers the transport writes (no switch needed): the protocol's version, the job's
fields, and a retransmission that differs from the original only by the RETX flag; lane
ops refused on a switch without them; the time split of run()."""

from __future__ import annotations

import time

import numpy as np
import pytest

from homagg.environment import TRANSPORT_IO_ENV
from homagg.wire.constants import AGG_HEADER_BYTES, AGG_VERSION, CELLS_PER_PKT, Flag, Op
from homagg.wire.header import FIELD_NAMES, HEADER_DTYPE, header_view
from homagg.wire.packer import parse_payloads
from homagg.worker.codecs import CodecError, Phase
from homagg.worker.transport.io_path import IO_PATHS
from homagg.worker.transport.switch_transport import (
    OpUnsupportedError,
    SwitchTransport,
    TransportConfig,
)


@pytest.fixture(autouse=True, params=IO_PATHS)
def io_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on each I/O path in turn."""
    monkeypatch.setenv(TRANSPORT_IO_ENV, request.param)
    return str(request.param)


def chunk_of(payload: bytes) -> int:
    return int(np.frombuffer(payload[:AGG_HEADER_BYTES], HEADER_DTYPE)["chunk"][0])


class LoseFirstSend:
    """A one-worker switch that loses every chunk's first packet and answers the next one
    with its cells as a resent result (RESULT|RETX, as the switch answers a resend of a
    complete round); keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.replies: list[bytes] = []

    def send(self, payload: bytes) -> None:
        first_of_chunk = all(chunk_of(p) != chunk_of(payload) for p in self.sent)
        self.sent.append(payload)
        if not first_of_chunk:
            reply = np.frombuffer(payload, np.uint8).copy()
            header_view(reply)["flags"] = int(Flag.RESULT | Flag.RETX)
            self.replies.append(reply.tobytes())

    def recv(self, timeout: float) -> bytes | None:
        return self.replies.pop(0) if self.replies else None

    def close(self) -> None:
        pass


def test_headers_and_retransmissions():
    channel = LoseFirstSend()
    transport = SwitchTransport(
        TransportConfig(job_id=4321, rank=0, world_size=1, pool_size=4), channel
    )
    cells = np.arange(3 * CELLS_PER_PKT - 5, dtype=np.int32) - 1000
    np.testing.assert_array_equal(transport.allreduce(Op.MAX, cells), cells)
    headers, _ = parse_payloads(b"".join(channel.sent))
    originals = headers[(headers["flags"] & Flag.RETX) == 0]
    assert len(originals) == 3
    assert set(originals["version"]) == {AGG_VERSION}
    assert set(originals["op"]) == {Op.MAX} and set(originals["job_id"]) == {4321}
    assert list(originals["chunk"]) == [0, 1, 2]
    assert list(originals["ncells"]) == [CELLS_PER_PKT, CELLS_PER_PKT, CELLS_PER_PKT - 5]
    for original in originals:
        resent = headers[(headers["chunk"] == original["chunk"]) & (headers["flags"] != 0)]
        assert len(resent) >= 1
        for field in FIELD_NAMES:
            want = int(original[field]) | (int(Flag.RETX) if field == "flags" else 0)
            assert {int(v) for v in resent[field]} == {want}, field


def test_lane_ops_are_refused_before_sending_when_the_switch_has_none():
    """A switch without ADD16 / ADD8 (the assignment's lane_ops false: the TNA program)
    would drop them as BAD_OP: the transport refuses them, sends nothing, keeps its chunk
    numbering, and still runs the other ops."""
    channel = LoseFirstSend()
    cfg = TransportConfig(job_id=7, rank=0, world_size=1, pool_size=4, lane_ops=False)
    transport = SwitchTransport(cfg, channel)
    cells = np.arange(10, dtype=np.int32)
    for op in (Op.ADD16, Op.ADD8):
        with pytest.raises(OpUnsupportedError, match=f"no {op.name}"):
            transport.allreduce(op, cells)
    assert channel.sent == [] and transport.next_chunk == 0
    assert isinstance(OpUnsupportedError("x"), CodecError)  # the hook falls back on it
    np.testing.assert_array_equal(transport.allreduce(Op.ADD, cells), cells)


def test_run_splits_its_time_into_encode_exchange_and_decode():
    def codec():
        time.sleep(0.02)  # encoding before the first phase
        got = yield Phase(Op.MAX, np.ones(4, np.int32))
        time.sleep(0.02)  # between phases: still the codec (encode)
        got = yield Phase(Op.ADD, got)
        time.sleep(0.03)  # after the last result: decode
        return got

    transport = SwitchTransport(
        TransportConfig(job_id=7, rank=0, world_size=1, pool_size=4), LoseFirstSend()
    )
    out = transport.run(codec())
    np.testing.assert_array_equal(out, np.ones(4, np.int32))
    s = transport.stats
    assert 0.04 <= s.encode_seconds < 0.2 and 0.03 <= s.decode_seconds < 0.2
    assert s.exchange_seconds > 0


@pytest.mark.parametrize("per", [16, 64])
def test_cells_per_packet_of_the_assignment(per):
    """The transport packs as many cells as its config says (the switch's program's, from
    the assignment), whatever the default build is, and reads results of that size only."""
    channel = LoseFirstSend()
    cfg = TransportConfig(job_id=5, rank=0, world_size=1, pool_size=4, cells_per_packet=per)
    transport = SwitchTransport(cfg, channel)
    cells = np.arange(2 * per + 3, dtype=np.int32) * 7 - 99
    np.testing.assert_array_equal(transport.allreduce(Op.ADD, cells), cells)
    headers, sent = parse_payloads(b"".join(channel.sent), per)
    originals = headers[(headers["flags"] & Flag.RETX) == 0]
    assert list(originals["ncells"]) == [per, per, 3] and sent.shape[1] == per
    assert {len(p) for p in channel.sent} == {16 + 4 * per}


def test_cells_per_packet_outside_the_choices_is_refused():
    with pytest.raises(ValueError, match="cells_per_packet 100 is none of"):
        SwitchTransport(
            TransportConfig(job_id=5, rank=0, world_size=1, pool_size=4, cells_per_packet=100),
            LoseFirstSend(),
        )
