"""SwitchConnection against the reference switch's P4Runtime server over gRPC on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, status_pb2

from homagg.control.switch_connection import (
    ArbitrationError,
    P4RuntimeWriteError,
    SwitchConnection,
    SwitchError,
)
from homagg.p4rt.api import p4runtime_pb2, p4runtime_pb2_grpc
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.p4rt.entities import TableEntry
from homagg.p4rt.p4info import P4InfoIndex

TIMEOUT = 3.0
ARP, LPM, ACL, JOB = "arp_responder", "SwitchIngress.forwarding.ipv4_lpm", "acl", "job_table"
ROUTE = "SwitchIngress.forwarding.route"


@pytest.fixture
def device_config(tmp_path: Path) -> Path:
    path = tmp_path / "program.json"
    path.write_text("{}")
    return path


@pytest.fixture
def connect(p4rt_switch: Any) -> Iterator[Callable[..., SwitchConnection]]:
    """Opens SwitchConnections to the test switch; closes them all afterwards."""
    opened: list[SwitchConnection] = []

    def make(election_id: int = 1, require_primary: bool = True) -> SwitchConnection:
        conn = SwitchConnection(p4rt_switch.address, p4rt_switch.device_id, election_id, TIMEOUT)
        opened.append(conn)
        conn.connect(require_primary=require_primary)
        return conn

    yield make
    for conn in opened:
        conn.close()


@pytest.fixture
def conn(
    connect: Callable[..., SwitchConnection], test_p4info_path: Path, device_config: Path
) -> SwitchConnection:
    """The primary connection, with the test pipeline pushed."""
    c = connect(1)
    c.set_pipeline(test_p4info_path, device_config)
    return c


def wait_for(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def write_codes(fn: Callable[[], None]) -> list[tuple[int, str]]:
    with pytest.raises(P4RuntimeWriteError) as info:
        fn()
    return [(e.index, e.code) for e in info.value.errors]


# -- session ---------------------------------------------------------------------------------


def test_arbitration_backup_and_handover(
    connect: Callable[..., SwitchConnection], test_p4info_path: Path, device_config: Path
) -> None:
    a = connect(10)
    assert a.is_connected and a.is_primary
    with pytest.raises(ArbitrationError, match="not primary"):
        connect(5)
    backup = connect(5, require_primary=False)
    assert not backup.is_primary and backup.primary_election_id == 10
    b = connect(20)  # takes over: a is told
    assert wait_for(lambda: not a.is_primary) and a.primary_election_id == 20
    with pytest.raises(SwitchError) as info:
        a.set_pipeline(test_p4info_path, device_config)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    b.set_pipeline(test_p4info_path, device_config)
    with pytest.raises(SwitchError) as info:
        a.insert_entry(ARP, {"hdr.arp.tpa": 1}, "arp_reply", {"mac": 1})
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    b.close()  # a is primary again
    assert wait_for(lambda: a.is_primary)
    a.insert_entry(ARP, {"hdr.arp.tpa": 1}, "arp_reply", {"mac": 1})
    assert a.is_connected and not b.is_connected


def test_duplicate_election_id(connect: Callable[..., SwitchConnection]) -> None:
    connect(3)
    with pytest.raises(ArbitrationError, match="INVALID_ARGUMENT"):
        connect(3)


def test_unreachable_switch() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn = SwitchConnection(f"127.0.0.1:{port}", timeout=0.3)
    with pytest.raises(ArbitrationError, match="unreachable"):
        conn.connect()
    assert not conn.is_connected


def test_lost_stream_is_detected(p4rt_switch: Any) -> None:
    with SwitchConnection(p4rt_switch.address, timeout=TIMEOUT) as conn:
        assert conn.is_connected and conn.capabilities() == "1.3.0"
        p4rt_switch.server.stop(0)
        assert wait_for(lambda: not conn.is_connected)
        assert conn.stream_error
    assert not conn.is_connected


def test_write_before_pipeline(
    connect: Callable[..., SwitchConnection], test_p4info_path: Path
) -> None:
    conn = connect(1)
    with pytest.raises(SwitchError) as info:
        conn.get_p4info()
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    conn._p4info = P4InfoIndex.from_text_file(
        test_p4info_path
    )  # known P4Info, so the Write is sent
    with pytest.raises(SwitchError) as info:
        conn.insert_entry(ARP, {"hdr.arp.tpa": 1}, "arp_reply", {"mac": 1})
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not isinstance(info.value, P4RuntimeWriteError)


def test_get_p4info_from_the_switch(
    conn: SwitchConnection, connect: Callable[..., SwitchConnection]
) -> None:
    other = connect(0, require_primary=False)
    assert other.get_p4info().table(LPM).size == 16
    assert other.p4info.action("route").name == ROUTE


# -- table entries ---------------------------------------------------------------------------


def test_entries_round_trip(conn: SwitchConnection, p4rt_switch: Any) -> None:
    ip, mac = ipv4_to_int("10.0.0.1"), mac_to_int("02:00:00:00:00:01")
    conn.insert_entry(ARP, {"hdr.arp.tpa": ip}, "arp_reply", {"mac": mac})
    route = {"port": 3, "src_mac": mac, "dst_mac": 7}
    conn.insert_entry(LPM, {"hdr.ipv4.dst_addr": (ipv4_to_int("10.1.0.0"), 16)}, "route", route)
    conn.insert_entry(
        ACL,
        {"hdr.ipv4.protocol": 17, "hdr.udp.dst_port": (0x1200, 0xFF00)},
        "set_port",
        {"port": 4},
        priority=10,
    )
    conn.insert_entry(ACL, {"hdr.ipv4.protocol": 6}, "NoAction", {}, priority=1)  # ternary left out
    entries = conn.read_entries()
    assert entries == [
        TableEntry(
            "SwitchIngress.forwarding.arp_responder",
            {"hdr.arp.tpa": ip},
            "SwitchIngress.forwarding.arp_reply",
            {"mac": mac},
        ),
        TableEntry(LPM, {"hdr.ipv4.dst_addr": (0x0A010000, 16)}, ROUTE, route),
        TableEntry(
            "SwitchIngress.acl",
            {"hdr.ipv4.protocol": 17, "hdr.udp.dst_port": (0x1200, 0xFF00)},
            "SwitchIngress.set_port",
            {"port": 4},
            10,
        ),
        TableEntry("SwitchIngress.acl", {"hdr.ipv4.protocol": 6}, "NoAction", {}, 1),
    ]
    assert p4rt_switch.device.table(LPM).lookup((0x0A010203,), 1) == (True, ROUTE, route)
    conn.modify_entry(LPM, {"hdr.ipv4.dst_addr": (0x0A010000, 16)}, "aggregate", {})
    assert [e.action for e in conn.read_entries(LPM)] == ["SwitchIngress.forwarding.aggregate"]
    conn.delete_entry(
        ACL, {"hdr.ipv4.protocol": 17, "hdr.udp.dst_port": (0x1200, 0xFF00)}, priority=10
    )
    conn.delete_entry(ARP, {"hdr.arp.tpa": ip})
    assert [e.match for e in conn.read_entries(ACL)] == [{"hdr.ipv4.protocol": 6}]
    assert conn.read_entries(ARP) == []


def test_default_actions(conn: SwitchConnection, p4rt_switch: Any) -> None:
    conn.set_default_action(LPM, "route", {"port": 1, "src_mac": 2, "dst_mac": 3})
    default = conn.read_default_action(LPM)
    assert default.is_default and (default.action, default.params) == (
        ROUTE,
        {"port": 1, "src_mac": 2, "dst_mac": 3},
    )
    assert p4rt_switch.device.table(LPM).lookup((1,), 1)[:2] == (False, ROUTE)
    assert conn.read_default_action(JOB).action == "SwitchIngress.aggregation.unknown_job"
    assert write_codes(lambda: conn.set_default_action(JOB, "unknown_job", {})) == [
        (0, "PERMISSION_DENIED")
    ]
    conn.write_batch(conn.batch().reset_default_action(LPM))
    assert conn.read_default_action(LPM).action == ""


def test_batch_and_per_update_errors(conn: SwitchConnection, test_p4info: Any) -> None:
    batch = (
        conn.batch()
        .insert_entry(ARP, {"hdr.arp.tpa": 1}, "arp_reply", {"mac": 1})
        .insert_entry(ARP, {"hdr.arp.tpa": 1}, "arp_reply", {"mac": 2})  # duplicate
        .modify_entry(ARP, {"hdr.arp.tpa": 9}, "arp_reply", {"mac": 2})  # missing
        .delete_entry(ARP, {"hdr.arp.tpa": 8})  # missing
        .insert_entry(ARP, {"hdr.arp.tpa": 2}, "no_route", {})
        .insert_entry(
            ARP, {"hdr.arp.tpa": 3}, "route", {"port": 1, "src_mac": 1, "dst_mac": 1}
        )  # not allowed
        .insert_entry(
            ACL, {"hdr.ipv4.protocol": 17, "hdr.udp.dst_port": (1, 1)}, "set_port", {"port": 1}
        )
        .insert_entry(ARP, {"hdr.arp.tpa": 4}, "no_route", {})
        .insert_entry(ARP, {"hdr.arp.tpa": 5}, "no_route", {})
        .insert_entry(ARP, {"hdr.arp.tpa": 6}, "no_route", {})
    )  # table full (size 4)
    assert len(batch) == 10
    with pytest.raises(P4RuntimeWriteError) as info:
        conn.write_batch(batch)
    assert [(e.index, e.code) for e in info.value.errors] == [
        (1, "ALREADY_EXISTS"),
        (2, "NOT_FOUND"),
        (3, "NOT_FOUND"),
        (5, "INVALID_ARGUMENT"),
        (6, "INVALID_ARGUMENT"),
        (9, "RESOURCE_EXHAUSTED"),
    ]
    assert info.value.code == grpc.StatusCode.UNKNOWN
    assert "Zero priority" in info.value.errors[4].message
    assert len(conn.read_entries(ARP)) == 4  # the others applied (CONTINUE_ON_ERROR)


def test_server_side_validation_errors(conn: SwitchConnection, test_p4info: Any) -> None:
    """Malformed updates the builder would refuse, sent raw: wrong kind, too wide, bad params."""
    arp = test_p4info.table(ARP)
    reply = test_p4info.action("arp_reply")

    def raw(
        value: bytes, kind: str = "exact", params: tuple[tuple[int, bytes], ...] = ((1, b"\x01"),)
    ) -> Any:
        u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        te = u.entity.table_entry
        te.table_id = arp.id
        fm = te.match.add(field_id=1)
        if kind == "exact":
            fm.exact.value = value
        else:
            fm.lpm.value, fm.lpm.prefix_len = value, 8
        te.action.action.action_id = reply.id
        for pid, v in params:
            te.action.action.params.add(param_id=pid, value=v)
        return u

    batch = conn.batch()
    for u in (
        raw(b"\x01\x00\x00\x00\x00"),
        raw(b"\x01", "lpm"),
        raw(b"\x02", params=()),
        raw(b"\x03", params=((1, b"\x01"), (2, b"\x01"))),
        raw(b"\x04", params=((1, b"\x01" * 7),)),
    ):
        batch.add(u)
    assert write_codes(lambda: conn.write_batch(batch)) == [
        (i, "INVALID_ARGUMENT") for i in range(5)
    ]


def test_client_side_errors(conn: SwitchConnection) -> None:
    with pytest.raises(ValueError, match="32 bits"):
        conn.insert_entry(ARP, {"hdr.arp.tpa": 1 << 32}, "arp_reply", {"mac": 1})
    with pytest.raises(ValueError, match="missing"):
        conn.insert_entry(ARP, {"hdr.arp.tpa": 1}, "arp_reply", {})
    with pytest.raises(TypeError, match="prefix_len"):
        conn.insert_entry(LPM, {"hdr.ipv4.dst_addr": 1}, "aggregate", {})
    with pytest.raises(KeyError, match="ipv4_lpm"):
        conn.insert_entry("ipv6_lpm", {}, "aggregate", {})


def test_register_write_unimplemented(conn: SwitchConnection, test_p4info: Any) -> None:
    update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
    update.entity.register_entry.register_id = test_p4info.register("slot_state").id
    update.entity.register_entry.index.index = 0
    update.entity.register_entry.data.bitstring = b"\x01"
    assert write_codes(lambda: conn.write_batch([update])) == [(0, "UNIMPLEMENTED")]


# -- multicast and counters ----------------------------------------------------------------------


def test_multicast_groups(conn: SwitchConnection, p4rt_switch: Any) -> None:
    conn.write_multicast_group(1, [(2, 1), (3, 2)])
    conn.write_multicast_group(2, [(4, 1)])
    assert conn.read_multicast_groups() == {1: [(2, 1), (3, 2)], 2: [(4, 1)]}
    assert p4rt_switch.device.multicast_groups[1] == [(2, 1), (3, 2)]
    conn.write_multicast_group(1, [(5, 1)], modify=True)
    conn.delete_multicast_group(2)
    assert conn.read_multicast_groups() == {1: [(5, 1)]}
    assert write_codes(lambda: conn.write_multicast_group(1, [])) == [(0, "ALREADY_EXISTS")]
    assert write_codes(lambda: conn.delete_multicast_group(9)) == [(0, "NOT_FOUND")]
    assert write_codes(lambda: conn.write_multicast_group(9, [], modify=True)) == [(0, "NOT_FOUND")]


def test_counters(conn: SwitchConnection, p4rt_switch: Any) -> None:
    drops = p4rt_switch.device.counter("drop_counter")
    drops.count(5, 100)
    drops.count(5, 60)
    cells = conn.read_counter("drop_counter")
    assert len(cells) == 16 and cells[5] == (2, 160) and cells[0] == (0, 0)
    assert conn.read_counter("SwitchIngress.drop_counter", 5) == {5: (2, 160)}
    conn.write_counter("drop_counter", 5)
    assert conn.read_counter("drop_counter", 5) == {5: (0, 0)}
    with pytest.raises(SwitchError) as info:
        conn.read_counter("drop_counter", 99)
    assert info.value.code == grpc.StatusCode.UNKNOWN


def test_direct_counters(conn: SwitchConnection, p4rt_switch: Any) -> None:
    params = {"pool_base": 0, "pool_size": 8, "num_workers": 2}
    conn.insert_entry(JOB, {"hdr.agg.job_id": 1}, "set_job", params)
    conn.insert_entry(JOB, {"hdr.agg.job_id": 2}, "set_job", params)
    job = p4rt_switch.device.table(JOB)
    for _ in range(3):
        job.lookup((2,), 500)
    got = {
        e.match["hdr.agg.job_id"]: (packets, nbytes)
        for e, packets, nbytes in conn.read_direct_counters(JOB)
    }
    assert got == {1: (0, 0), 2: (3, 1500)}
    conn.write_batch(conn.batch().write_direct_counter(JOB, {"hdr.agg.job_id": 2}))
    assert [c[1:] for c in conn.read_direct_counters(JOB)] == [(0, 0), (0, 0)]


def test_every_failure_of_a_large_batch_keeps_its_code(conn: SwitchConnection) -> None:
    """1000 updates in one batch: one Write's trailer could list the codes of ~150 failures
    (the reference switch then sends a summary without them, and the caller could not tell
    ALREADY_EXISTS from NOT_FOUND); write_batch sends Writes of at most
    MAX_UPDATES_PER_WRITE, so each failure comes back with its index in the batch and its
    code, and the updates that could be applied are."""
    batch = conn.batch()
    for i in range(1000):
        if i == 500:
            batch.insert_entry(ARP, {"hdr.arp.tpa": 7}, "arp_reply", {"mac": 1})  # applied
        elif i == 501:
            batch.insert_entry(ARP, {"hdr.arp.tpa": 7}, "arp_reply", {"mac": 2})  # duplicate
        else:
            batch.delete_entry(ARP, {"hdr.arp.tpa": 10_000 + i})  # missing
    with pytest.raises(P4RuntimeWriteError) as info:
        conn.write_batch(batch)
    expected = [(i, "NOT_FOUND") for i in range(1000) if i not in (500, 501)]
    expected.insert(500, (501, "ALREADY_EXISTS"))
    assert [(e.index, e.code) for e in info.value.errors] == expected
    assert str(info.value).startswith("999 of 1000 P4Runtime updates failed")
    [entry] = conn.read_entries(ARP)
    assert entry.match == {"hdr.arp.tpa": 7} and entry.params == {"mac": 1}


class _UnboundedStatusSwitch(p4runtime_pb2_grpc.P4RuntimeServicer):
    """A P4Runtime server that, like PI (BMv2), fails every Write with one p4.v1.Error per
    update and full messages, however large the trailer grows (about 250 bytes per update)."""

    def StreamChannel(self, requests: Any, context: grpc.ServicerContext) -> Any:
        for request in requests:
            if request.HasField("arbitration"):
                reply = p4runtime_pb2.StreamMessageResponse()
                reply.arbitration.CopyFrom(request.arbitration)
                reply.arbitration.status.code = 0  # primary
                yield reply

    def Write(self, request: Any, context: grpc.ServicerContext) -> Any:
        status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
        for _ in request.updates:
            error = p4runtime_pb2.Error(
                canonical_code=code_pb2.NOT_FOUND, message="Cannot find match entry " + "x" * 200
            )
            status.details.add().Pack(error)
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.set_code(grpc.StatusCode.UNKNOWN)
        context.set_details(status.message)
        return p4runtime_pb2.WriteResponse()


def test_the_client_reads_per_update_errors_beyond_grpcs_default_metadata_limit() -> None:
    """PI never bounds a failing Write's trailer: 100 failures with its messages make ~25 KB,
    over gRPC's default 16 KiB metadata limit (the call would end without its errors). The
    controller's channel takes up to 1 MiB (homagg.p4rt.api.GRPC_OPTIONS): every error
    arrives with its code."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(_UnboundedStatusSwitch(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn = SwitchConnection(f"127.0.0.1:{port}", 0, 1, TIMEOUT)
    try:
        conn.connect()
        batch = [p4runtime_pb2.Update(type=p4runtime_pb2.Update.DELETE) for _ in range(100)]
        with pytest.raises(P4RuntimeWriteError) as info:
            conn.write_batch(batch)
        assert [e.index for e in info.value.errors] == list(range(100))
        assert {e.code for e in info.value.errors} == {"NOT_FOUND"}
    finally:
        conn.close()
        server.stop(0)
