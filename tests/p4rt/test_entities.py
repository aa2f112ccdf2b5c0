"""homagg.p4rt.entities: every entity kind survives to_proto/from_proto with the test P4Info,
values go out canonical and don't cares left out, and malformed keys and actions are refused
with PI's codes and messages."""

from __future__ import annotations

import pytest
from google.rpc import code_pb2

from homagg.p4rt import entities
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.entities import (
    CounterData,
    CounterEntry,
    DirectCounterEntry,
    EntityError,
    MulticastGroupEntry,
    TableEntry,
)
from homagg.p4rt.p4info import P4InfoIndex

ACL, LPM, CLASSIFIER = "SwitchIngress.acl", "SwitchIngress.forwarding.ipv4_lpm", "classifier"
ROUTE = "SwitchIngress.forwarding.route"
MAX48 = (1 << 48) - 1

TABLE_ENTRIES = [
    TableEntry(
        "SwitchIngress.forwarding.arp_responder",
        {"hdr.arp.tpa": 0},  # an exact 0: one byte, never left out
        "SwitchIngress.forwarding.arp_reply",
        {"mac": MAX48},  # the widest parameter at its maximum
    ),
    TableEntry(
        LPM,
        {"hdr.ipv4.dst_addr": (0x0A010000, 16)},
        ROUTE,
        {"port": 511, "src_mac": 0, "dst_mac": 1},
    ),
    TableEntry(LPM, {"hdr.ipv4.dst_addr": (0xFFFFFFFF, 32)}, "SwitchIngress.forwarding.aggregate"),
    TableEntry(
        ACL,
        {"hdr.ipv4.protocol": 255, "hdr.udp.dst_port": (0x1200, 0xFF00)},
        "SwitchIngress.set_port",
        {"port": 4},
        priority=10,
    ),
    TableEntry(
        ACL, {"hdr.ipv4.protocol": 6, "hdr.udp.dst_port": (0xFFFF, 0xFFFF)}, "NoAction", {}, 1
    ),
    TableEntry(ACL, {"hdr.ipv4.protocol": 6}, "NoAction", priority=2),  # ternary left out
    TableEntry(
        "SwitchEgress.classifier", {"hdr.udp.src_port": (0, 0xFFFE)}, "NoAction", priority=3
    ),
    TableEntry("SwitchEgress.classifier", {"std.ingress_port": 511}, "NoAction", priority=4),
    TableEntry("SwitchEgress.classifier", {"std.ingress_port": 0}, "NoAction", priority=5),
    TableEntry(LPM, {}, ROUTE, {"port": 1, "src_mac": 2, "dst_mac": 3}, is_default=True),
    TableEntry(LPM, is_default=True),  # a default reset: no action
    TableEntry(
        "SwitchIngress.aggregation.job_table",
        {"hdr.agg.job_id": 2},
        "SwitchIngress.aggregation.set_job",
        {"pool_base": 0, "pool_size": 8, "num_workers": 2},
        controller_metadata=7,
        metadata=b"\x00note",
        counter_data=CounterData(3, 1500),
    ),
]


@pytest.mark.parametrize("entry", TABLE_ENTRIES, ids=lambda e: f"{e.table}:{e.match}")
def test_table_entry_round_trip(test_p4info: P4InfoIndex, entry: TableEntry) -> None:
    msg = entry.to_proto(test_p4info)
    again = p4runtime_pb2.TableEntry.FromString(msg.SerializeToString())
    assert TableEntry.from_proto(again, test_p4info) == entry


def test_table_entry_by_alias_decodes_to_full_names(test_p4info: P4InfoIndex) -> None:
    entry = TableEntry("ipv4_lpm", {"hdr.ipv4.dst_addr": (0x0A000000, 8)}, "aggregate")
    decoded = TableEntry.from_proto(entry.to_proto(test_p4info), test_p4info)
    assert (decoded.table, decoded.action) == (LPM, "SwitchIngress.forwarding.aggregate")


def test_values_are_canonical_and_dont_cares_left_out(test_p4info: P4InfoIndex) -> None:
    entry = TableEntry(
        "classifier",
        {"hdr.udp.src_port": (0, 0xFFFF), "std.ingress_port": None},  # both don't care
        "NoAction",
        priority=1,
    )
    assert not entry.to_proto(test_p4info).match
    lpm = TableEntry(LPM, {"hdr.ipv4.dst_addr": (0, 0)}, "aggregate").to_proto(test_p4info)
    acl = TableEntry(ACL, {"hdr.ipv4.protocol": 0, "hdr.udp.dst_port": (5, 0)}, "NoAction")
    assert not lpm.match
    [protocol] = acl.to_proto(test_p4info).match
    assert protocol.exact.value == b"\x00"
    route = TableEntry(
        LPM,
        {"hdr.ipv4.dst_addr": (0x0A000000, 8)},
        ROUTE,
        {"port": 1, "src_mac": 0x0100, "dst_mac": MAX48},
    )
    msg = route.to_proto(test_p4info)
    assert msg.match[0].lpm.value == b"\x0a\x00\x00\x00"
    assert [p.value for p in msg.action.action.params] == [b"\x01", b"\x01\x00", b"\xff" * 6]


def test_padded_values_decode(test_p4info: P4InfoIndex) -> None:
    msg = TableEntry(
        ACL, {"hdr.ipv4.protocol": 6, "hdr.udp.dst_port": (1, 3)}, "NoAction", priority=1
    ).to_proto(test_p4info)
    msg.match[1].ternary.value = b"\x00\x00\x01"
    assert TableEntry.from_proto(msg, test_p4info).match["hdr.udp.dst_port"] == (1, 3)


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (TableEntry(ACL, {"hdr.ipv4.protocol": 256}, "NoAction"), ValueError),  # too wide
        (TableEntry(ACL, {"hdr.ipv4.protocol": (1, 2)}, "NoAction"), TypeError),
        (TableEntry(LPM, {"hdr.ipv4.dst_addr": 1}, "aggregate"), TypeError),
        (TableEntry(LPM, {}, ROUTE, {"port": 1}), ValueError),  # missing params
        (TableEntry(LPM, {}, "aggregate", {"port": 1}), ValueError),  # unknown param
        (TableEntry(LPM, {"nope": 1}, "aggregate"), KeyError),
    ],
)
def test_encoding_refuses_bad_values(
    test_p4info: P4InfoIndex, entry: TableEntry, error: type
) -> None:
    with pytest.raises(error):
        entry.to_proto(test_p4info)


def _with_field(test_p4info: P4InfoIndex, table: str, build) -> p4runtime_pb2.TableEntry:
    msg = p4runtime_pb2.TableEntry(table_id=test_p4info.table_id(table), priority=1)
    build(msg.match.add())
    return msg


def _lpm0(fm) -> None:
    fm.field_id, fm.lpm.value, fm.lpm.prefix_len = 1, b"\x00", 0


def _ternary0(fm) -> None:
    fm.field_id, fm.ternary.value, fm.ternary.mask = 2, b"\x00", b"\x00"


def _full_range(fm) -> None:
    fm.field_id, fm.range.low, fm.range.high = 1, b"\x00", b"\xff\xff"


def _wrong_kind(fm) -> None:
    fm.field_id, fm.exact.value = 1, b"\x01"


def _too_wide(fm) -> None:
    fm.field_id, fm.optional.value = 2, b"\x02\x00"  # 512 in a 9-bit field


@pytest.mark.parametrize(
    ("table", "build", "message"),
    [
        (LPM, _lpm0, "'don't care' LPM match"),
        (ACL, _ternary0, "'don't care' ternary match"),
        (CLASSIFIER, _full_range, "'don't care' range match"),
        (CLASSIFIER, _wrong_kind, "Invalid match type for field hdr.udp.src_port"),
        (CLASSIFIER, _too_wide, "does not fit within 9 bits"),
    ],
)
def test_decoding_refuses_malformed_keys(
    test_p4info: P4InfoIndex, table: str, build, message: str
) -> None:
    msg = _with_field(test_p4info, table, build)
    if table == ACL:  # the exact field too, so that only the ternary one is wrong
        msg.match.add(field_id=1).exact.value = b"\x06"
    with pytest.raises(EntityError, match=message) as info:
        TableEntry.from_proto(msg, test_p4info)
    assert info.value.code == code_pb2.INVALID_ARGUMENT


def test_decoding_refuses_bad_key_shapes(test_p4info: P4InfoIndex) -> None:
    acl = test_p4info.table(ACL)
    exact = p4runtime_pb2.FieldMatch(field_id=1)
    exact.exact.value = b"\x06"
    unknown = p4runtime_pb2.FieldMatch(field_id=9)
    unknown.exact.value = b"\x06"
    cases = [
        ([exact, exact, exact], "Too many fields"),
        ([exact, exact], "Duplicate field id 1"),
        ([], r"Missing non-ternary field in match key \(hdr.ipv4.protocol\)"),
        ([exact, unknown], r"Unknown field in match key \(ids \[9\]\)"),
    ]
    for fields, message in cases:
        with pytest.raises(EntityError, match=message):
            entities.decode_match(acl, fields)


def test_decoding_refuses_bad_actions(test_p4info: P4InfoIndex) -> None:
    route = (
        TableEntry(LPM, {}, ROUTE, {"port": 1, "src_mac": 2, "dst_mac": 3})
        .to_proto(test_p4info)
        .action
    )
    short = p4runtime_pb2.TableAction()
    short.CopyFrom(route)
    del short.action.params[0]
    unknown_id = p4runtime_pb2.TableAction()
    unknown_id.action.action_id = 99
    profile = p4runtime_pb2.TableAction(action_profile_member_id=1)
    cases = [
        (short, "Unexpected number of action parameters"),
        (unknown_id, "Invalid P4 id: no action with id 99"),
        (profile, "Cannot provide indirect action for direct table"),
    ]
    for action, message in cases:
        with pytest.raises(EntityError, match=message):
            entities.decode_action(test_p4info, action)
    assert entities.decode_action(test_p4info, route)[1] == {"port": 1, "src_mac": 2, "dst_mac": 3}


@pytest.mark.parametrize(
    "entry",
    [
        CounterEntry("SwitchIngress.drop_counter", 15, CounterData((1 << 63) - 1, 0)),
        CounterEntry("SwitchIngress.drop_counter", 0, CounterData(0, 0)),
        CounterEntry("SwitchIngress.drop_counter"),  # a read of every cell
    ],
)
def test_counter_entry_round_trip(test_p4info: P4InfoIndex, entry: CounterEntry) -> None:
    msg = p4runtime_pb2.Entity.FromString(entry.to_entity(test_p4info).SerializeToString())
    assert CounterEntry.from_proto(msg.counter_entry, test_p4info) == entry


def test_direct_counter_entry_round_trip(test_p4info: P4InfoIndex) -> None:
    entry = DirectCounterEntry(
        TableEntry("SwitchIngress.aggregation.job_table", {"hdr.agg.job_id": 0xFFFF}),
        CounterData(3, 1500),
    )
    msg = entry.to_entity(test_p4info)
    assert not msg.direct_counter_entry.table_entry.HasField("action")
    assert DirectCounterEntry.from_proto(msg.direct_counter_entry, test_p4info) == entry


@pytest.mark.parametrize(
    "group",
    [
        MulticastGroupEntry(1, ((1, 1), (2, 1), (511, 2))),
        MulticastGroupEntry(0x7FFF),  # no replicas
        MulticastGroupEntry(3, ((0, 0),)),  # port 0, instance 0
    ],
)
def test_multicast_group_round_trip(group: MulticastGroupEntry) -> None:
    msg = group.to_proto()
    assert all(r.WhichOneof("port_kind") == "egress_port" for r in msg.replicas)
    assert MulticastGroupEntry.from_proto(msg) == group


def test_multicast_group_ports_as_bytes() -> None:
    group = MulticastGroupEntry(5, ((2, 1), (300, 1)), {(300, 1): 4})
    msg = group.to_proto()
    assert [r.WhichOneof("port_kind") for r in msg.replicas] == ["egress_port", "port"]
    assert msg.replicas[1].port == b"\x00\x00\x01\x2c"
    decoded = MulticastGroupEntry.from_proto(msg)
    assert decoded == group and decoded.port_widths == {(300, 1): 4}


def test_update_wraps_every_kind(test_p4info: P4InfoIndex) -> None:
    update_type = p4runtime_pb2.Update
    values = [
        TABLE_ENTRIES[0],
        CounterEntry("drop_counter", 1, CounterData(0, 0)),
        DirectCounterEntry(TableEntry("job_table", {"hdr.agg.job_id": 1}), CounterData(0, 0)),
        MulticastGroupEntry(1, ((1, 1),)),
    ]
    kinds = [
        "table_entry",
        "counter_entry",
        "direct_counter_entry",
        "packet_replication_engine_entry",
    ]
    for kind, (value, expected) in zip(
        (update_type.INSERT, update_type.MODIFY, update_type.MODIFY, update_type.DELETE),
        zip(values, kinds),
    ):
        update = entities.update(kind, value, test_p4info)
        assert update.type == kind and update.entity.WhichOneof("entity") == expected
