"""Integers <-> P4Runtime byte strings, plus MAC and IPv4 text helpers.

P4Runtime 1.4 §8.4: a binary value is sent big-endian; the canonical form is the
shortest string of at least one byte. Readers must also accept padded strings
(leading zero bytes) as long as the value fits the field's bit width.
"""

from __future__ import annotations

import ipaddress


def _check_width(bitwidth: int) -> None:
    if bitwidth <= 0:
        raise ValueError(f"bit width must be positive, got {bitwidth}")


def encode(value: int, bitwidth: int) -> bytes:
    """Encode `value` in canonical P4Runtime form; ValueError if it does not fit `bitwidth` bits."""
    _check_width(bitwidth)
    if value < 0 or value >> bitwidth:
        raise ValueError(f"value {value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode(data: bytes, bitwidth: int) -> int:
    """Decode a canonical or padded byte string; ValueError if the value exceeds `bitwidth` bits.

    An empty string decodes to 0, as PI (BMv2's P4Runtime server) accepts it.
    """
    _check_width(bitwidth)
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise ValueError(f"byte string {data.hex() or '(empty)'} does not fit in {bitwidth} bits")
    return value


def padded(value: int, bitwidth: int) -> bytes:
    """Encode `value` on exactly ceil(bitwidth / 8) bytes (the form old P4Runtime servers want)."""
    encode(value, bitwidth)  # range check
    return value.to_bytes((bitwidth + 7) // 8, "big")


def mac_to_int(mac: str) -> int:
    """'aa:bb:cc:dd:ee:ff' (or '-' separated) -> 48-bit integer."""
    parts = mac.replace("-", ":").split(":")
    if len(parts) != 6 or not all(1 <= len(p) <= 2 for p in parts):
        raise ValueError(f"not a MAC address: {mac!r}")
    try:
        return int("".join(p.zfill(2) for p in parts), 16)
    except ValueError:
        raise ValueError(f"not a MAC address: {mac!r}") from None


def int_to_mac(value: int) -> str:
    """48-bit integer -> 'aa:bb:cc:dd:ee:ff'."""
    if not 0 <= value < 1 << 48:
        raise ValueError(f"value {value} does not fit in 48 bits")
    return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))


def ipv4_to_int(address: str) -> int:
    """'10.0.0.1' -> 32-bit integer."""
    try:
        return int(ipaddress.IPv4Address(address))
    except ipaddress.AddressValueError as exc:
        raise ValueError(f"not an IPv4 address: {address!r}") from exc


def int_to_ipv4(value: int) -> str:
    """32-bit integer -> '10.0.0.1'."""
    if not 0 <= value < 1 << 32:
        raise ValueError(f"value {value} does not fit in 32 bits")
    return str(ipaddress.IPv4Address(value))
