"""homagg.wire.constants mirrors p4src/include/constants.p4: one source, checked."""

from __future__ import annotations

from p4source import constant_values, typedef_widths

from homagg.wire import constants as c
from homagg.wire.lanes import top_bits


def test_wire_constants_match_the_p4_program():
    p4 = constant_values()
    assert p4["CELLS_PER_PKT"] == c.CELLS_PER_PKT
    assert p4["NUM_SLOTS"] == c.NUM_SLOTS
    assert p4["SHADOW_BITS"] == c.SHADOW_BITS
    assert p4["SHADOW_COPIES"] == c.SHADOW_COPIES == 2
    assert p4["NUM_SLOT_COPIES"] == c.NUM_SLOT_COPIES == c.SHADOW_COPIES * c.NUM_SLOTS
    assert p4["AGG_UDP_PORT"] == c.AGG_UDP_PORT
    assert p4["AGG_VERSION"] == c.AGG_VERSION
    assert p4["AGG_HEADER_BYTES"] == c.AGG_HEADER_BYTES
    assert p4["AGG_UDP_LENGTH"] == c.AGG_UDP_LENGTH
    assert p4["AGG_IPV4_LENGTH"] == c.AGG_IPV4_LENGTH
    assert p4["RESULT_TTL"] == c.RESULT_TTL
    for code in ("ETHERTYPE_IPV4", "ETHERTYPE_ARP", "IP_PROTO_UDP", "ARP_HTYPE_ETHERNET"):
        assert p4[code] == getattr(c, code)
    assert (p4["ARP_OPER_REQUEST"], p4["ARP_OPER_REPLY"]) == (c.ARP_OPER_REQUEST, c.ARP_OPER_REPLY)
    assert p4["NUM_DROP_REASONS"] == c.NUM_DROP_REASONS
    assert p4["NUM_EVENTS"] == c.NUM_EVENTS
    assert p4["SLOT_FINAL"] == c.SLOT_FINAL and p4["SLOT_COUNT_MASK"] == c.SLOT_COUNT_MASK
    for flag in c.Flag:
        assert p4[f"AGG_FLAG_{flag.name}"] == flag.value
    for op in c.Op:
        assert p4[f"AGG_OP_{op.name}"] == op.value
    for reason in c.DropReason:
        assert p4[f"DROP_{reason.name}"] == reason.value
    for event in c.Event:
        assert p4[f"EVENT_{event.name}"] == event.value
    assert len(c.DropReason) <= c.NUM_DROP_REASONS and len(c.Event) <= c.NUM_EVENTS


def test_slot_final_is_the_count_fields_top_bit_above_every_count():
    assert c.SLOT_FINAL | c.SLOT_COUNT_MASK == 0xFF and c.SLOT_FINAL & c.SLOT_COUNT_MASK == 0
    assert c.MAX_WORKERS_PER_JOB <= c.SLOT_COUNT_MASK


def test_every_p4_event_is_known_to_python():
    p4 = constant_values()
    assert {k[len("EVENT_") :] for k in p4 if k.startswith("EVENT_")} == {e.name for e in c.Event}


def test_every_p4_drop_reason_is_known_to_python():
    p4 = constant_values()
    names = {k[len("DROP_") :] for k in p4 if k.startswith("DROP_")}
    assert names == {r.name for r in c.DropReason}


def test_widths_match_the_p4_typedefs():
    widths = typedef_widths()
    assert widths["job_id_t"] == c.JOB_ID_BITS
    assert widths["chunk_t"] == c.CHUNK_BITS
    assert widths["port_t"] == c.PORT_BITS
    # The switch's registers and the pool base are indexed with 32 bits (v1model).
    assert (1 << widths["slot_index_t"]) > c.NUM_SLOT_COPIES


def test_named_limits_follow_from_the_widths():
    assert c.MAX_JOB_ID == 0xFFFF == (1 << c.JOB_ID_BITS) - 1
    assert c.CHUNK_MODULUS == 2**32 and c.CHUNK_MASK == 0xFFFFFFFF == c.CHUNK_MODULUS - 1
    assert c.CELL_MASK == 0xFFFFFFFF and c.CELL_BITS == 32
    assert c.DROP_PORT == 511 and c.MAX_SWITCH_PORT == 510  # v1model's drop port is 511
    assert c.MAX_L4_PORT == 65535 and 0 < c.WORKER_UDP_BASE <= c.MAX_L4_PORT - c.MAX_WORKERS_PER_JOB
    # A register entry holds LANES_PER_GROUP cells of CELL_BITS in a bit<256>.
    p4 = constant_values()
    assert p4["LANES_PER_GROUP"] * c.CELL_BITS == 256
    assert p4["CELL_GROUPS"] * p4["LANES_PER_GROUP"] == c.CELLS_PER_PKT


def test_lane_top_bits_match_the_lane_layout():
    """The P4 program's SWAR masks (one bit<256> register group = 8 cells) are the top bit
    of every lane of homagg.wire.lanes, in every cell of the group."""
    p4 = constant_values()
    for name, bits in (("LANE16_TOP_BITS", 16), ("LANE8_TOP_BITS", 8)):
        cell = int(top_bits(bits))
        group = sum(cell << (c.CELL_BITS * i) for i in range(p4["LANES_PER_GROUP"]))
        assert p4[name] == group, name
    assert int(top_bits(16)) == 0x80008000 and int(top_bits(8)) == 0x80808080
