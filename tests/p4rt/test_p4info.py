"""P4InfoIndex: name/alias/id lookups over the hand-written test P4Info."""

from __future__ import annotations

from pathlib import Path

import pytest

from homagg.p4rt.api import p4info_pb2
from homagg.p4rt.p4info import P4InfoIndex, P4InfoLookupError


def test_tables_by_name_alias_and_id(test_p4info: P4InfoIndex) -> None:
    lpm = test_p4info.table("SwitchIngress.forwarding.ipv4_lpm")
    assert test_p4info.table("ipv4_lpm") is lpm
    assert test_p4info.table(lpm.id) is lpm
    assert test_p4info.table_id("ipv4_lpm") == 33554434
    assert test_p4info.table_name(33554434) == "SwitchIngress.forwarding.ipv4_lpm"
    assert lpm.size == 16
    assert [(f.id, f.name, f.bitwidth, f.match_type) for f in lpm.match_fields] == [
        (1, "hdr.ipv4.dst_addr", 32, "lpm")
    ]
    assert not lpm.needs_priority
    assert test_p4info.table("acl").needs_priority
    assert len(test_p4info.tables) == 5


def test_match_fields(test_p4info: P4InfoIndex) -> None:
    acl = test_p4info.table("acl")
    assert acl.match_field("hdr.udp.dst_port").match_type == "ternary"
    assert acl.match_field(1).name == "hdr.ipv4.protocol"
    classifier = test_p4info.table("classifier")
    assert [f.match_type for f in classifier.match_fields] == ["range", "optional"]
    with pytest.raises(P4InfoLookupError, match=r"hdr\.ipv4\.protocol"):
        acl.match_field("hdr.nope")


def test_actions_and_params(test_p4info: P4InfoIndex) -> None:
    route = test_p4info.action("route")
    assert route.name == "SwitchIngress.forwarding.route"
    assert test_p4info.action_id("SwitchIngress.forwarding.route") == route.id
    assert test_p4info.action_name(route.id) == route.name
    assert [(p.id, p.name, p.bitwidth) for p in route.params] == [
        (1, "port", 9),
        (2, "src_mac", 48),
        (3, "dst_mac", 48),
    ]
    assert route.param("src_mac").id == 2
    assert route.param(3).name == "dst_mac"
    with pytest.raises(P4InfoLookupError, match="port, src_mac, dst_mac"):
        route.param("vlan")


def test_table_actions_scopes_and_defaults(test_p4info: P4InfoIndex) -> None:
    assert [a.alias for a in test_p4info.table_actions("ipv4_lpm")] == [
        "route",
        "aggregate",
        "no_route",
    ]
    job = test_p4info.table("job_table")
    unknown = test_p4info.action("unknown_job")
    assert job.const_default_action_id == unknown.id
    assert job.action_scopes[unknown.id] == "default_only"
    assert job.action_scopes[test_p4info.action_id("set_job")] == "table_and_default"
    arp = test_p4info.table("arp_responder")
    assert arp.initial_default_action == (test_p4info.action_id("no_route"), ())
    assert arp.const_default_action_id == 0


def test_counters_and_registers(test_p4info: P4InfoIndex) -> None:
    drops = test_p4info.counter("drop_counter")
    assert (drops.name, drops.size, drops.unit) == ("SwitchIngress.drop_counter", 16, "both")
    direct = test_p4info.table_direct_counter("job_table")
    assert direct is not None and direct.name == "SwitchIngress.aggregation.job_packets"
    assert direct.direct_table_id == test_p4info.table_id("job_table")
    assert test_p4info.direct_counter("job_packets") is direct
    assert test_p4info.table_direct_counter("ipv4_lpm") is None
    reg = test_p4info.register("slot_state")
    assert (reg.size, reg.bitwidth) == (16, 64)


def test_unknown_names_list_the_known_ones(test_p4info: P4InfoIndex) -> None:
    with pytest.raises(P4InfoLookupError) as info:
        test_p4info.table("ipv6_lpm")
    assert isinstance(info.value, KeyError)
    assert "ipv6_lpm" in str(info.value) and "SwitchIngress.forwarding.ipv4_lpm" in str(info.value)
    with pytest.raises(KeyError):
        test_p4info.action(12345)
    with pytest.raises(KeyError, match="drop_counter"):
        test_p4info.counter("drops")
    with pytest.raises(KeyError):
        test_p4info.register("nope")


def test_from_bytes_and_text_agree(test_p4info_path: Path, test_p4info: P4InfoIndex) -> None:
    again = P4InfoIndex.from_bytes(test_p4info.proto.SerializeToString())
    assert again.proto == test_p4info.proto
    assert P4InfoIndex.from_text(test_p4info_path.read_text()).table("acl") == test_p4info.table(
        "acl"
    )


def test_direct_counter_found_from_direct_table_id() -> None:
    """p4c lists direct counters in direct_resource_ids; the counter's direct_table_id suffices."""
    p4info = p4info_pb2.P4Info()
    t = p4info.tables.add()
    t.preamble.id, t.preamble.name = 7, "t"
    c = p4info.direct_counters.add()
    c.preamble.id, c.preamble.name, c.direct_table_id = 9, "c", 7
    assert P4InfoIndex(p4info).table("t").direct_counter_id == 9


def test_unique_dotted_suffixes_find_entities_under_a_pipeline_prefix() -> None:
    """TNA's P4Info names the pipeline first; the v1model names still find its entities."""
    p4info = p4info_pb2.P4Info()
    for i, name in enumerate(
        ("pipe.SwitchIngress.aggregation.job_table", "pipe.SwitchEgress.delivery.job_table")
    ):
        t = p4info.tables.add()
        t.preamble.id, t.preamble.name = 33554432 + i, name
    index = P4InfoIndex(p4info)
    assert index.table("SwitchIngress.aggregation.job_table").id == 33554432
    assert index.table("delivery.job_table").id == 33554433
    with pytest.raises(P4InfoLookupError):
        index.table("job_table")  # two entities end with it
