"""The aggregation header as a Scapy layer, bound to UDP on AGG_UDP_PORT (either side).

For tests, fuzzing and debugging; the hot path uses homagg.wire.packer. The header fields
come from homagg.wire.header.AGG_HEADER_FIELDS; only their display (flag and op names) and
defaults are chosen here.
"""

from scapy.fields import (
    ByteEnumField,
    ByteField,
    Field,
    FieldListField,
    FlagsField,
    IntField,
    ShortField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from homagg.wire.constants import AGG_UDP_PORT, AGG_VERSION, CELLS_PER_PKT, Flag, Op
from homagg.wire.header import AGG_HEADER_FIELDS, HeaderField

_UNSIGNED_BY_WIDTH = {8: ByteField, 16: ShortField, 32: IntField}
_DEFAULTS = {"version": AGG_VERSION, "op": Op.ADD, "ncells": CELLS_PER_PKT}
_FLAG_NAMES = [flag.name for flag in sorted(Flag, key=int)]
if [int(flag) for flag in sorted(Flag, key=int)] != [1 << i for i in range(len(Flag))]:
    raise AssertionError("Flag values must be the bits 0, 1, ... of the flags field")


def scapy_field(field: HeaderField) -> Field:
    """The Scapy field of one header field: same name and width, readable flags and op."""
    default = _DEFAULTS.get(field.name, 0)
    if field.name == "flags":
        return FlagsField(field.name, default, field.bits, _FLAG_NAMES)
    if field.name == "op" and field.bits == 8:
        return ByteEnumField(field.name, default, {op.value: op.name for op in Op})
    return _UNSIGNED_BY_WIDTH[field.bits](field.name, default)


class Agg(Packet):
    """Aggregation header followed by CELLS_PER_PKT big-endian int32 cells."""

    name = "Agg"
    # scapy reads fields_desc per Packet class: a class attribute by its design.
    fields_desc = [  # noqa: RUF012
        *(scapy_field(f) for f in AGG_HEADER_FIELDS),
        FieldListField(
            "cells",
            [0] * CELLS_PER_PKT,  # type: ignore[list-item]  # scapy's stub wants fields
            SignedIntField("cell", 0),
            count_from=lambda pkt: CELLS_PER_PKT,
            max_count=CELLS_PER_PKT,
        ),
    ]


bind_layers(UDP, Agg, dport=AGG_UDP_PORT)
bind_layers(UDP, Agg, sport=AGG_UDP_PORT)
