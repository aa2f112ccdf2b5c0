"""The switch's forwarding state: table lookups by match kind, defaults, sizes, counters."""

from __future__ import annotations

import json

import pytest
from google.rpc import code_pb2

from homagg.p4rt.p4info import P4InfoIndex
from homagg.refswitch.device import Device, DeviceError

FULL32 = 0xFFFFFFFF


@pytest.fixture
def device(test_p4info: P4InfoIndex) -> Device:
    d = Device()
    d.load_pipeline(test_p4info.proto, b"")
    return d


def _code(exc: pytest.ExceptionInfo[DeviceError]) -> str:
    return code_pb2.Code.Name(exc.value.code)


def test_no_pipeline_yet() -> None:
    d = Device()
    assert d.p4info is None
    with pytest.raises(KeyError):
        d.table("ipv4_lpm")


def test_exact_lookup_and_default(device: Device, test_p4info: P4InfoIndex) -> None:
    arp = device.table("SwitchIngress.forwarding.arp_responder")
    assert device.table("arp_responder") is arp
    # The P4Info's initial_default_action (no_route) answers a miss.
    assert arp.lookup((0x0A000001,), 60) == (False, "SwitchIngress.forwarding.no_route", {})
    arp.insert(((0x0A000001, FULL32),), test_p4info.action("arp_reply"), {"mac": 0xAA})
    assert arp.lookup((0x0A000001,), 60) == (
        True,
        "SwitchIngress.forwarding.arp_reply",
        {"mac": 0xAA},
    )
    arp.modify(((0x0A000001, FULL32),), test_p4info.action("arp_reply"), {"mac": 0xBB})
    assert arp.lookup((0x0A000001,), 60)[2] == {"mac": 0xBB}
    arp.delete(((0x0A000001, FULL32),))
    assert arp.lookup((0x0A000001,), 60)[0] is False


def test_lpm_longest_prefix_wins(device: Device, test_p4info: P4InfoIndex) -> None:
    lpm = device.table("ipv4_lpm")
    route, aggregate = test_p4info.action("route"), test_p4info.action("aggregate")
    lpm.insert(((0x0A000000, 8),), route, {"port": 1, "src_mac": 1, "dst_mac": 1})
    lpm.insert(((0x0A010000, 16),), route, {"port": 2, "src_mac": 1, "dst_mac": 1})
    lpm.insert(((0x0A010203, 32),), aggregate, {})
    lpm.insert(((0, 0),), route, {"port": 9, "src_mac": 1, "dst_mac": 1})  # omitted field: /0
    assert lpm.lookup((0x0A010203,), 1) == (True, "SwitchIngress.forwarding.aggregate", {})
    assert lpm.lookup((0x0A010204,), 1)[2]["port"] == 2
    assert lpm.lookup((0x0A020000,), 1)[2]["port"] == 1
    assert lpm.lookup((0x0B000000,), 1)[2]["port"] == 9
    lpm.delete(((0x0A010000, 16),))
    assert lpm.lookup((0x0A010204,), 1)[2]["port"] == 1
    lpm.delete(((0, 0),))
    # No NoAction in this table and no default in the P4Info: an empty action on a miss.
    assert lpm.lookup((0x0B000000,), 1) == (False, "", {})


def test_ternary_priority_order(device: Device, test_p4info: P4InfoIndex) -> None:
    acl = device.table("acl")
    set_port = test_p4info.action("set_port")
    acl.insert(((17, 0xFF), (0x1000, 0xF000)), set_port, {"port": 1}, priority=10)
    acl.insert(((17, 0xFF), (0x1234, 0xFFFF)), set_port, {"port": 2}, priority=20)
    acl.insert(((17, 0xFF), (0, 0)), set_port, {"port": 3}, priority=1)  # udp port: don't care
    acl.insert(
        ((17, 0xFF), (0x1230, 0xFFF0)), set_port, {"port": 4}, priority=10
    )  # same priority, later
    assert acl.lookup((17, 0x1234), 1)[2] == {"port": 2}
    assert acl.lookup((17, 0x1235), 1)[2] == {"port": 1}  # ties: first inserted
    assert acl.lookup((17, 0x2000), 1)[2] == {"port": 3}
    assert acl.lookup((6, 0x1234), 1) == (False, "NoAction", {})
    acl.delete(((17, 0xFF), (0x1234, 0xFFFF)), priority=20)
    assert acl.lookup((17, 0x1234), 1)[2] == {"port": 1}
    # The same match at another priority is another entry.
    acl.insert(((17, 0xFF), (0x1000, 0xF000)), set_port, {"port": 5}, priority=30)
    assert acl.lookup((17, 0x1234), 1)[2] == {"port": 5}
    assert len(acl) == 4


def test_range_and_optional(device: Device, test_p4info: P4InfoIndex) -> None:
    cls = device.table("classifier")
    set_port = test_p4info.action("set_port")
    cls.insert(((1000, 2000), (0, 0)), set_port, {"port": 1}, priority=1)  # any ingress port
    cls.insert(((1500, 1600), (7, 0x1FF)), set_port, {"port": 2}, priority=5)  # ingress port 7 only
    assert cls.dont_care(0) == (0, 0xFFFF) and cls.dont_care(1) == (0, 0)
    cls.insert((cls.dont_care(0), (3, 0x1FF)), set_port, {"port": 3}, priority=2)
    assert cls.lookup((1550, 7), 1)[2] == {"port": 2}
    assert cls.lookup((1550, 8), 1)[2] == {"port": 1}
    assert cls.lookup((2000, 7), 1)[2] == {"port": 1}
    assert cls.lookup((2001, 3), 1)[2] == {"port": 3}
    assert cls.lookup((999, 7), 1)[0] is False


def test_duplicate_missing_and_full(device: Device, test_p4info: P4InfoIndex) -> None:
    arp = device.table("arp_responder")
    reply = test_p4info.action("arp_reply")
    for ip in range(4):  # size 4 in the P4Info
        arp.insert(((ip, FULL32),), reply, {"mac": ip})
    with pytest.raises(DeviceError) as exc:
        arp.insert(((0, FULL32),), reply, {"mac": 0})
    assert _code(exc) == "ALREADY_EXISTS"
    with pytest.raises(DeviceError) as exc:
        arp.insert(((9, FULL32),), reply, {"mac": 0})
    assert _code(exc) == "RESOURCE_EXHAUSTED"
    with pytest.raises(DeviceError) as exc:
        arp.modify(((9, FULL32),), reply, {"mac": 0})
    assert _code(exc) == "NOT_FOUND"
    with pytest.raises(DeviceError) as exc:
        arp.delete(((9, FULL32),))
    assert _code(exc) == "NOT_FOUND"


@pytest.mark.parametrize(
    "table, match, priority, code",
    [
        ("arp_responder", ((1 << 32, FULL32),), 0, "INVALID_ARGUMENT"),  # too wide
        ("arp_responder", ((1, FULL32), (1, FULL32)), 0, "INVALID_ARGUMENT"),  # too many fields
        ("arp_responder", ((1, FULL32),), 5, "INVALID_ARGUMENT"),  # priority on an exact table
        ("ipv4_lpm", ((0x0A000001, 8),), 0, "INVALID_ARGUMENT"),  # bits past the prefix
        ("ipv4_lpm", ((0x0A000000, 33),), 0, "INVALID_ARGUMENT"),  # prefix too long
        ("acl", ((17, 0xFF), (0x1234, 0xFF00)), 1, "INVALID_ARGUMENT"),  # value & mask != value
        ("acl", ((17, 0xFF), (0x1200, 0xFF00)), 0, "INVALID_ARGUMENT"),  # ternary needs a priority
        ("classifier", ((20, 10), (0, 0)), 1, "INVALID_ARGUMENT"),  # low > high
    ],
)
def test_malformed_matches(
    device: Device, test_p4info: P4InfoIndex, table: str, match: tuple, priority: int, code: str
) -> None:
    t = device.table(table)
    action = test_p4info.table_actions(table)[0]
    params = {p.name: 0 for p in action.params}
    with pytest.raises(DeviceError) as exc:
        t.insert(match, action, params, priority)
    assert _code(exc) == code


def test_action_checks(device: Device, test_p4info: P4InfoIndex) -> None:
    arp, job = device.table("arp_responder"), device.table("job_table")
    arp_key, job_key = ((1, FULL32),), ((1, 0xFFFF),)
    cases = [
        (
            arp,
            arp_key,
            "route",
            {"port": 1, "src_mac": 1, "dst_mac": 1},
            "INVALID_ARGUMENT",
        ),  # not allowed
        (arp, arp_key, "arp_reply", {}, "INVALID_ARGUMENT"),  # missing param
        (arp, arp_key, "arp_reply", {"mac": 1, "vlan": 2}, "INVALID_ARGUMENT"),  # extra param
        (arp, arp_key, "arp_reply", {"mac": 1 << 48}, "INVALID_ARGUMENT"),  # too wide
        (job, job_key, "unknown_job", {}, "PERMISSION_DENIED"),  # @defaultonly
    ]
    for table, key, action, params, code in cases:
        with pytest.raises(DeviceError) as exc:
            table.insert(key, test_p4info.action(action), params)
        assert _code(exc) == code, (action, params)


def test_default_actions(device: Device, test_p4info: P4InfoIndex) -> None:
    lpm, job = device.table("ipv4_lpm"), device.table("job_table")
    lpm.set_default(test_p4info.action("route"), {"port": 4, "src_mac": 1, "dst_mac": 2})
    assert lpm.lookup((1,), 1) == (
        False,
        "SwitchIngress.forwarding.route",
        {"port": 4, "src_mac": 1, "dst_mac": 2},
    )
    lpm.reset_default()
    assert lpm.lookup((1,), 1) == (False, "", {})
    # Const default action: a miss runs it, nobody may change it.
    assert job.lookup((3,), 1) == (False, "SwitchIngress.aggregation.unknown_job", {})
    for attempt in (
        lambda: job.set_default(test_p4info.action("unknown_job"), {}),
        job.reset_default,
    ):
        with pytest.raises(DeviceError) as exc:
            attempt()
        assert _code(exc) == "PERMISSION_DENIED"


def test_direct_counter_counts_hits_only(device: Device, test_p4info: P4InfoIndex) -> None:
    job = device.table("job_table")
    assert job.has_counter and not device.table("acl").has_counter
    entry = job.insert(
        ((7, 0xFFFF),),
        test_p4info.action("set_job"),
        {"pool_base": 1, "pool_size": 2, "num_workers": 3},
    )
    for _ in range(3):
        assert job.lookup((7,), 100)[0]
    job.lookup((8,), 100)
    assert (entry.packets, entry.bytes) == (3, 300)
    assert (job.default.packets, job.default.bytes) == (0, 0)
    job.modify(
        ((7, 0xFFFF),),
        test_p4info.action("set_job"),
        {"pool_base": 9, "pool_size": 2, "num_workers": 3},
    )
    assert job.get(((7, 0xFFFF),)).packets == 3  # a MODIFY keeps the counter


def test_indirect_counter(device: Device) -> None:
    drops = device.counter("drop_counter")
    assert device.counter("SwitchIngress.drop_counter") is drops
    drops.count(3, 100)
    drops.count(3, 50)
    drops.count(16, 10)  # out of range: ignored, like BMv2
    drops.count(-1, 10)
    assert drops.read(3) == (2, 150)
    assert sum(drops.packets) == 2
    drops.write(3, 7, 8)
    assert drops.read(3) == (7, 8)
    with pytest.raises(IndexError):
        drops.read(16)
    drops.reset()
    assert drops.read(3) == (0, 0)


def test_load_pipeline_resets_everything(device: Device, test_p4info: P4InfoIndex) -> None:
    generation = device.config_generation
    device.table("arp_responder").insert(
        ((1, FULL32),), test_p4info.action("arp_reply"), {"mac": 1}
    )
    device.table("ipv4_lpm").set_default(test_p4info.action("aggregate"), {})
    device.counter("drop_counter").count(1, 1)
    device.multicast_groups[1] = [(1, 1)]
    device.load_pipeline(test_p4info.proto, b"{}")
    assert device.config_generation == generation + 1
    assert len(device.table("arp_responder")) == 0
    assert device.table("ipv4_lpm").lookup((1,), 1) == (False, "", {})
    assert device.counter("drop_counter").read(1) == (0, 0)
    assert device.multicast_groups == {}
    assert device.device_config == b"{}"


def test_initial_defaults_from_bmv2_json(test_p4info: P4InfoIndex) -> None:
    """P4Info has no non-const default action: BMv2 JSON's default_entry supplies it."""
    program = {
        "actions": [
            {"name": "SwitchIngress.forwarding.route", "id": 3, "runtime_data": []},
            {"name": "SwitchIngress.forwarding.no_route", "id": 4, "runtime_data": []},
        ],
        "pipelines": [
            {
                "name": "ingress",
                "tables": [
                    {
                        "name": "SwitchIngress.forwarding.ipv4_lpm",
                        "default_entry": {
                            "action_id": 3,
                            "action_const": False,
                            "action_data": ["0x5", "0x0a", "0x0b"],
                            "action_entry_const": False,
                        },
                    },
                    {
                        "name": "SwitchIngress.not_in_p4info",
                        "default_entry": {"action_id": 4, "action_data": []},
                    },
                ],
            }
        ],
    }
    d = Device()
    d.load_pipeline(test_p4info.proto, json.dumps(program).encode())
    lpm = d.table("ipv4_lpm")
    expected = (False, "SwitchIngress.forwarding.route", {"port": 5, "src_mac": 10, "dst_mac": 11})
    assert lpm.lookup((1,), 1) == expected
    lpm.set_default(test_p4info.action("no_route"), {})
    lpm.reset_default()  # back to the program's default, not to "nothing"
    assert lpm.lookup((1,), 1) == expected
