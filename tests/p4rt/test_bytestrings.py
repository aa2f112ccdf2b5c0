"""Integer <-> P4Runtime byte string conversions (canonical form, P4Runtime 1.4 §8.4)."""

from __future__ import annotations

import pytest

from homagg.p4rt import bytestrings


@pytest.mark.parametrize(
    "value, width, expected",
    [
        (0, 1, b"\x00"),
        (0, 48, b"\x00"),
        (1, 9, b"\x01"),
        (0x1FF, 9, b"\x01\xff"),
        (0x0A000001, 32, b"\x0a\x00\x00\x01"),
        (0x000001, 32, b"\x01"),
        (0xAABBCCDDEEFF, 48, bytes.fromhex("aabbccddeeff")),
        (1 << 255, 256, b"\x80" + bytes(31)),
    ],
)
def test_encode_is_canonical(value: int, width: int, expected: bytes) -> None:
    assert bytestrings.encode(value, width) == expected
    assert bytestrings.decode(expected, width) == value


@pytest.mark.parametrize("value, width", [(2, 1), (512, 9), (1 << 32, 32), (-1, 8)])
def test_encode_rejects_values_that_do_not_fit(value: int, width: int) -> None:
    with pytest.raises(ValueError, match=f"{width} bits"):
        bytestrings.encode(value, width)


def test_decode_accepts_padded_and_empty() -> None:
    assert bytestrings.decode(b"\x00\x00\x00\x05", 32) == 5
    # longer than the field, leading zeros
    assert bytestrings.decode(b"\x00\x00\x01\xff", 9) == 0x1FF
    assert bytestrings.decode(b"", 16) == 0  # PI accepts it too


@pytest.mark.parametrize(
    "data, width", [(b"\x02\x00", 9), (b"\x01\x00", 8), (b"\x00\x01\x00\x00\x00\x00", 32)]
)
def test_decode_rejects_too_wide(data: bytes, width: int) -> None:
    with pytest.raises(ValueError, match=f"{width} bits"):
        bytestrings.decode(data, width)


def test_bad_width() -> None:
    with pytest.raises(ValueError):
        bytestrings.encode(0, 0)


def test_padded() -> None:
    assert bytestrings.padded(1, 9) == b"\x00\x01"
    assert bytestrings.padded(0x0A000001, 32) == b"\x0a\x00\x00\x01"


def test_mac_round_trip() -> None:
    assert bytestrings.mac_to_int("aa:bb:cc:dd:ee:ff") == 0xAABBCCDDEEFF
    assert bytestrings.mac_to_int("00-00-00-00-00-01") == 1
    assert bytestrings.int_to_mac(0x0A0B0C0D0E0F) == "0a:0b:0c:0d:0e:0f"
    for bad in ("aa:bb", "aa:bb:cc:dd:ee:gg", "aabbccddeeff", "aa:bb:cc:dd:ee:fff"):
        with pytest.raises(ValueError):
            bytestrings.mac_to_int(bad)
    with pytest.raises(ValueError):
        bytestrings.int_to_mac(1 << 48)


def test_ipv4_round_trip() -> None:
    assert bytestrings.ipv4_to_int("10.0.0.1") == 0x0A000001
    assert bytestrings.int_to_ipv4(0xC0A80101) == "192.168.1.1"
    for bad in ("10.0.0", "256.0.0.1", "host"):
        with pytest.raises(ValueError):
            bytestrings.ipv4_to_int(bad)
    with pytest.raises(ValueError):
        bytestrings.int_to_ipv4(-1)
