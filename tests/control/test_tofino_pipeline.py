"""homagg/control/tofino_pipeline.py: the BfPipelineConfig a Stratum Tofino switch takes, packed
from a bf-p4c output directory, on the wire as bf.proto numbers its fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from homagg.control.tofino_pipeline import (
    PipelineConfig,
    PipelineConfigError,
    Profile,
    from_compiler_output,
    main,
)


def _output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "pipe").mkdir(parents=True)
    (out / "bfrt.json").write_text('{"tables": []}')
    (out / "pipe" / "context.json").write_text('{"program_name": "homagg_tna"}')
    (out / "pipe" / "tofino.bin").write_bytes(bytes(range(256)) * 4)
    return out


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, payload) of a length-delimited-only message level."""
    got, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        length, i = _varint(data, i)
        got.append((key >> 3, key & 7, data[i : i + length]))
        i += length
    return got


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def test_packs_the_compiler_output_with_bf_proto_field_numbers(tmp_path):
    cfg = from_compiler_output(_output(tmp_path), pipe_scope=(0, 2))
    data = cfg.pack()
    top = _fields(data)
    assert [(n, w) for n, w, _ in top] == [(1, 2), (2, 2), (3, 2)]
    assert top[0][2] == b"homagg_tna" and top[1][2] == b'{"tables": []}'
    profile = _fields(top[2][2])
    assert [n for n, _, _ in profile] == [1, 2, 3, 4]
    assert profile[0][2] == b"pipe" and profile[2][2] == bytes(range(256)) * 4
    assert profile[3][2] == bytes([0, 2])  # packed repeated uint32
    assert PipelineConfig.unpack(data) == cfg


def test_round_trip_of_several_profiles():
    cfg = PipelineConfig(
        "p", b"{}", [Profile("a", b"1", b"\x00", (0,)), Profile("b", b"2", b"", (1, 3))]
    )
    assert PipelineConfig.unpack(cfg.pack()) == cfg


def test_missing_files_say_what_to_do(tmp_path):
    out = _output(tmp_path)
    (out / "pipe" / "tofino.bin").unlink()
    with pytest.raises(PipelineConfigError, match="bfas"):
        from_compiler_output(out)
    (out / "bfrt.json").unlink()
    with pytest.raises(PipelineConfigError, match=r"bfrt\.json"):
        from_compiler_output(out)
    with pytest.raises(PipelineConfigError, match="not a bf-p4c output"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "bfrt.json").write_text("{}")
        from_compiler_output(tmp_path / "empty")


def test_command_writes_the_device_config(tmp_path, capsys):
    out, dest = _output(tmp_path), tmp_path / "device_config.pb"
    assert main([str(out), "-o", str(dest), "--pipes", "0,1"]) == 0
    assert PipelineConfig.unpack(dest.read_bytes()).profiles[0].pipe_scope == (0, 1)
    assert main([str(tmp_path / "nowhere"), "-o", str(dest)]) == 1
    assert "bfrt.json" in capsys.readouterr().err
