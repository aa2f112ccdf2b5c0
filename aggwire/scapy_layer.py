"""The aggregation header as a Scapy layer, bound to UDP on AGG_UDP_PORT (either side).

For tests, fuzzing and debugging; the hot path uses aggwire.packer.
"""

from scapy.fields import (
    ByteEnumField,
    ByteField,
    FieldListField,
    FlagsField,
    IntField,
    ShortField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from aggwire.constants import AGG_UDP_PORT, AGG_VERSION, CELLS_PER_PKT, Op


class Agg(Packet):
    """Aggregation header followed by CELLS_PER_PKT big-endian int32 cells."""

    name = "Agg"
    fields_desc = [
        ByteField("version", AGG_VERSION),
        FlagsField("flags", 0, 8, ["RESULT", "RETX"]),
        ByteEnumField("op", Op.ADD, {op.value: op.name for op in Op}),
        ByteField("rank", 0),
        ShortField("job_id", 0),
        ShortField("slot", 0),
        ByteField("shadow", 0),
        ByteField("exp", 0),
        ShortField("ncells", CELLS_PER_PKT),
        IntField("chunk", 0),
        FieldListField("cells", [0] * CELLS_PER_PKT, SignedIntField("cell", 0),
                       count_from=lambda pkt: CELLS_PER_PKT, max_count=CELLS_PER_PKT),
    ]


bind_layers(UDP, Agg, dport=AGG_UDP_PORT)
bind_layers(UDP, Agg, sport=AGG_UDP_PORT)
