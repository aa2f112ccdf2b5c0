"""The reference switch's P4Runtime server at the wire level: statuses and messages like PI's."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, status_pb2

from homagg.p4rt.api import GRPC_OPTIONS, p4info_pb2, p4runtime_pb2, p4runtime_pb2_grpc
from homagg.p4rt.p4info import P4InfoIndex
from homagg.refswitch import p4runtime_server, p4runtime_write
from homagg.refswitch.device import Device
from homagg.refswitch.p4runtime_server import P4RuntimeServer

Update = p4runtime_pb2.Update
SetAction = p4runtime_pb2.SetForwardingPipelineConfigRequest
TIMEOUT = 5.0


class Stream:
    """A StreamChannel fed from a queue; a thread collects its responses (or final RpcError)."""

    def __init__(self, stub: p4runtime_pb2_grpc.P4RuntimeStub) -> None:
        self.requests: queue.Queue[Any] = queue.Queue()
        self.responses: queue.Queue[Any] = queue.Queue()
        self.call = stub.StreamChannel(iter(self.requests.get, None))
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        try:
            for response in self.call:
                self.responses.put(response)
            self.responses.put("closed")
        except grpc.RpcError as exc:
            self.responses.put(exc)

    def arbitrate(self, election_id: int, device_id: int = 0, role: str = "") -> None:
        request = p4runtime_pb2.StreamMessageRequest()
        request.arbitration.device_id = device_id
        request.arbitration.election_id.low = election_id
        if role:
            request.arbitration.role.name = role
        self.requests.put(request)

    def recv(self, timeout: float = TIMEOUT) -> Any:
        return self.responses.get(timeout=timeout)

    def status(self) -> tuple[int, int]:
        """(status code, primary election id) of the next arbitration update."""
        arb = self.recv().arbitration
        return arb.status.code, arb.election_id.low

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.thread.join(TIMEOUT)


@pytest.fixture
def stub(p4rt_switch: Any) -> Iterator[p4runtime_pb2_grpc.P4RuntimeStub]:
    with grpc.insecure_channel(p4rt_switch.address) as channel:
        yield p4runtime_pb2_grpc.P4RuntimeStub(channel)


@pytest.fixture
def streams(stub: p4runtime_pb2_grpc.P4RuntimeStub) -> Iterator[Any]:
    opened: list[Stream] = []

    def open_stream(election_id: int | None = None) -> Stream:
        s = Stream(stub)
        opened.append(s)
        if election_id is not None:
            s.arbitrate(election_id)
        return s

    yield open_stream
    for s in opened:
        s.close()


def push(
    stub: Any,
    p4info: p4info_pb2.P4Info,
    election_id: int | None = 1,
    action: int = SetAction.VERIFY_AND_COMMIT,
    config: bytes = b"{}",
) -> None:
    request = SetAction(device_id=0, action=action)
    if election_id is not None:
        request.election_id.low = election_id
    request.config.p4info.CopyFrom(p4info)
    request.config.p4_device_config = config
    stub.SetForwardingPipelineConfig(request, timeout=TIMEOUT)


@pytest.fixture
def primary(stub: Any, streams: Any, test_p4info: P4InfoIndex) -> Stream:
    """A primary stream (election id 1) with the test pipeline installed."""
    s = streams(1)
    assert s.status() == (code_pb2.OK, 1)
    push(stub, test_p4info.proto)
    return s


def write(
    stub: Any, *updates: p4runtime_pb2.Update, election_id: int | None = 1, **fields: Any
) -> None:
    request = p4runtime_pb2.WriteRequest(device_id=0, updates=updates, **fields)
    if election_id is not None:
        request.election_id.low = election_id
    stub.Write(request, timeout=TIMEOUT)


def read(stub: Any, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
    request = p4runtime_pb2.ReadRequest(device_id=0, entities=[entity])
    return [e for r in stub.Read(request, timeout=TIMEOUT) for e in r.entities]


def rpc_error(fn: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)
    return info.value


def update_errors(exc: grpc.RpcError) -> list[p4runtime_pb2.Error]:
    """The p4.v1.Error of every update, from grpc-status-details-bin."""
    assert exc.code() == grpc.StatusCode.UNKNOWN
    status = status_pb2.Status.FromString(dict(exc.trailing_metadata())["grpc-status-details-bin"])
    assert status.code == code_pb2.UNKNOWN
    errors = [p4runtime_pb2.Error() for _ in status.details]
    assert all(packed.Unpack(err) for packed, err in zip(status.details, errors, strict=True))
    return errors


def table_update(
    p4info: P4InfoIndex,
    kind: int,
    table: str,
    fields: list[tuple[str, str, Any]],
    action: str | None = None,
    params: dict[str, bytes] | None = None,
    priority: int = 0,
) -> p4runtime_pb2.Update:
    """An update from raw bytes: fields are (name, kind, value or (a, b)), params name -> bytes."""
    info = p4info.table(table)
    update = Update(type=kind)
    te = update.entity.table_entry
    te.table_id, te.priority = info.id, priority
    for name, fkind, value in fields:
        fm = te.match.add(field_id=info.match_field(name).id)
        if fkind == "exact":
            fm.exact.value = value
        elif fkind == "lpm":
            fm.lpm.value, fm.lpm.prefix_len = value
        elif fkind == "ternary":
            fm.ternary.value, fm.ternary.mask = value
    if action is not None:
        a = p4info.action(action)
        te.action.action.action_id = a.id
        for pname, pvalue in (params or {}).items():
            te.action.action.params.add(param_id=a.param(pname).id, value=pvalue)
    return update


# -- capabilities and arbitration ----------------------------------------------------------


def test_capabilities_and_arbitration(stub: Any, streams: Any) -> None:
    assert (
        stub.Capabilities(
            p4runtime_pb2.CapabilitiesRequest(), timeout=TIMEOUT
        ).p4runtime_api_version
        == "1.3.0"
    )
    a = streams(5)
    assert a.status() == (code_pb2.OK, 5)
    b = streams(3)  # lower: backup, told who is primary; a hears nothing
    assert b.status() == (code_pb2.ALREADY_EXISTS, 5)
    c = streams(9)  # higher: everybody is told
    assert a.status() == (code_pb2.ALREADY_EXISTS, 9)  # the old primary learns it was replaced
    assert b.status() == (code_pb2.ALREADY_EXISTS, 9)
    assert c.status() == (code_pb2.OK, 9)
    c.close()  # the primary leaves: re-election, everybody left is told
    assert a.status() == (code_pb2.OK, 5)
    assert b.status() == (code_pb2.ALREADY_EXISTS, 5)
    b.close()  # a backup leaves: nobody is told
    with pytest.raises(queue.Empty):
        a.recv(timeout=0.2)


def test_duplicate_election_id_ends_the_new_stream(streams: Any) -> None:
    a = streams(4)
    assert a.status()[0] == code_pb2.OK
    b = streams(4)
    exc = b.recv()
    assert isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_wrong_device_and_roles(stub: Any, streams: Any) -> None:
    s = streams()
    s.arbitrate(1, device_id=7)
    exc = s.recv()
    assert exc.code() == grpc.StatusCode.NOT_FOUND
    r = streams()
    r.arbitrate(1, role="sdn")
    assert r.recv().arbitration.status.code == code_pb2.UNIMPLEMENTED
    assert r.recv().code() == grpc.StatusCode.UNIMPLEMENTED
    request = p4runtime_pb2.ReadRequest(device_id=7)
    assert (
        rpc_error(lambda: list(stub.Read(request, timeout=TIMEOUT))).code()
        == grpc.StatusCode.NOT_FOUND
    )


def test_packet_out_gets_a_stream_error(primary: Stream) -> None:
    request = p4runtime_pb2.StreamMessageRequest()
    request.packet.payload = b"\x00" * 60
    primary.requests.put(request)
    error = primary.recv().error
    assert error.canonical_code == code_pb2.UNIMPLEMENTED
    assert error.packet_out.packet_out.payload == b"\x00" * 60


# -- pipeline ------------------------------------------------------------------------------


def test_no_pipeline_yet(stub: Any, streams: Any, test_p4info: P4InfoIndex) -> None:
    streams(1).status()
    update = table_update(
        test_p4info,
        Update.INSERT,
        "arp_responder",
        [("hdr.arp.tpa", "exact", b"\x01")],
        "arp_reply",
        {"mac": b"\x01"},
    )
    assert rpc_error(write, stub, update).code() == grpc.StatusCode.FAILED_PRECONDITION
    entity = p4runtime_pb2.Entity()
    entity.table_entry.SetInParent()
    assert rpc_error(read, stub, entity).code() == grpc.StatusCode.FAILED_PRECONDITION
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0)
    assert (
        rpc_error(stub.GetForwardingPipelineConfig, get).code()
        == grpc.StatusCode.FAILED_PRECONDITION
    )


def test_pipeline_needs_the_primary(stub: Any, streams: Any, test_p4info: P4InfoIndex) -> None:
    streams(2).status()
    for election_id in (1, None):
        assert (
            rpc_error(push, stub, test_p4info.proto, election_id).code()
            == grpc.StatusCode.PERMISSION_DENIED
        )
    push(stub, test_p4info.proto, 2)


def test_no_stream_no_election_id_is_accepted_like_pi(stub: Any, test_p4info: P4InfoIndex) -> None:
    assert rpc_error(push, stub, test_p4info.proto, 1).code() == grpc.StatusCode.PERMISSION_DENIED
    push(stub, test_p4info.proto, None)


def test_pipeline_actions(
    p4rt_switch: Any, stub: Any, streams: Any, test_p4info: P4InfoIndex
) -> None:
    streams(1).status()
    device: Device = p4rt_switch.device
    push(stub, test_p4info.proto, action=SetAction.VERIFY)
    assert device.p4info is None
    assert (
        rpc_error(push, stub, test_p4info.proto, action=SetAction.COMMIT).code()
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert (
        rpc_error(push, stub, test_p4info.proto, action=SetAction.UNSPECIFIED).code()
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    push(stub, test_p4info.proto, action=SetAction.VERIFY_AND_SAVE, config=b'{"saved": 1}')
    assert device.device_config == b'{"saved": 1}'
    push(stub, test_p4info.proto, action=SetAction.COMMIT)
    generation = device.config_generation
    push(stub, test_p4info.proto, action=SetAction.RECONCILE_AND_COMMIT)
    assert device.config_generation == generation + 1


def test_get_pipeline_response_types(stub: Any, primary: Stream, test_p4info: P4InfoIndex) -> None:
    get_request = p4runtime_pb2.GetForwardingPipelineConfigRequest
    request = SetAction(device_id=0, action=SetAction.VERIFY_AND_COMMIT)
    request.election_id.low = 1
    request.config.p4info.CopyFrom(test_p4info.proto)
    request.config.p4_device_config = b"json"
    request.config.cookie.cookie = 42
    stub.SetForwardingPipelineConfig(request, timeout=TIMEOUT)
    for kind, has_p4info, has_config in [
        (get_request.ALL, True, True),
        (get_request.COOKIE_ONLY, False, False),
        (get_request.P4INFO_AND_COOKIE, True, False),
        (get_request.DEVICE_CONFIG_AND_COOKIE, False, True),
    ]:
        config = stub.GetForwardingPipelineConfig(
            get_request(device_id=0, response_type=kind), timeout=TIMEOUT
        ).config
        assert config.HasField("p4info") == has_p4info
        assert (config.p4_device_config == b"json") == has_config
        assert config.cookie.cookie == 42
    assert (
        P4InfoIndex(
            stub.GetForwardingPipelineConfig(
                get_request(device_id=0), timeout=TIMEOUT
            ).config.p4info
        ).proto
        == test_p4info.proto
    )


def test_validate_config_hook(test_p4info: P4InfoIndex) -> None:
    def validate(p4info: p4info_pb2.P4Info, config: bytes) -> None:
        if config != b"good":
            raise ValueError("not the program")

    server = P4RuntimeServer(Device(), 0, validate_config=validate)
    port = server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
            exc = rpc_error(push, stub, test_p4info.proto, None, config=b"bad")
            assert (
                exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                and "not the program" in exc.details()
            )
            push(stub, test_p4info.proto, None, config=b"good")
    finally:
        server.stop(0)


# -- writes ----------------------------------------------------------------------------------


def test_write_needs_the_primary_election_id(
    stub: Any, primary: Stream, streams: Any, test_p4info: P4InfoIndex
) -> None:
    streams(0).status()  # a backup
    update = table_update(
        test_p4info,
        Update.INSERT,
        "arp_responder",
        [("hdr.arp.tpa", "exact", b"\x01")],
        "arp_reply",
        {"mac": b"\x01"},
    )
    for election_id in (0, 2, None):
        exc = rpc_error(write, stub, update, election_id=election_id)
        assert exc.code() == grpc.StatusCode.PERMISSION_DENIED and exc.details() == "Not primary"
    write(stub, update)


def test_per_update_errors(stub: Any, primary: Stream, test_p4info: P4InfoIndex) -> None:
    def arp(value: bytes, kind: int = Update.INSERT, **params: bytes) -> Update:
        return table_update(
            test_p4info,
            kind,
            "arp_responder",
            [("hdr.arp.tpa", "exact", value)],
            "arp_reply",
            params or {"mac": b"\x01"},
        )

    lpm_fields = [("hdr.ipv4.dst_addr", "exact", b"\x0a")]  # wrong match kind
    acl_fields = [
        ("hdr.ipv4.protocol", "exact", b"\x11"),
        ("hdr.udp.dst_port", "ternary", (b"\x10", b"\xf0")),
    ]
    unknown_table = Update(type=Update.INSERT)
    unknown_table.entity.table_entry.table_id = 1234
    register = Update(type=Update.MODIFY)
    register.entity.register_entry.register_id = test_p4info.register("slot_state").id
    register.entity.register_entry.index.index = 0
    updates = [
        arp(b"\x0a\x00\x00\x01"),  # 0 ok
        arp(b"\x00\x0a\x00\x00\x01"),  # 1 same key, padded: duplicate
        arp(b"\x01\x00\x00\x00\x00"),  # 2 33 bits
        arp(b"\x02", Update.MODIFY),  # 3 missing
        arp(b"\x02", Update.DELETE),  # 4 missing
        table_update(test_p4info, Update.INSERT, "ipv4_lpm", lpm_fields, "aggregate"),  # 5 kind
        unknown_table,  # 6
        table_update(
            test_p4info, Update.INSERT, "acl", acl_fields, "set_port", {"port": b"\x01"}
        ),  # 7 priority
        table_update(
            test_p4info,
            Update.INSERT,
            "arp_responder",
            [("hdr.arp.tpa", "exact", b"\x03")],
            "route",
            {"port": b"\x01", "src_mac": b"\x01", "dst_mac": b"\x01"},
        ),  # 8 not allowed
        arp(b"\x04"),  # 9 unknown param id (set below)
        arp(b"\x05", mac=b"\x01\x00\x00\x00\x00\x00\x00"),  # 10 param too wide
        register,  # 11
        arp(b"\x06"),
        arp(b"\x07"),
        arp(b"\x08"),  # 12-14: fills the 4 entries
        arp(b"\x09"),  # 15 full
    ]
    updates[9].entity.table_entry.action.action.params[0].param_id = 99
    errors = update_errors(rpc_error(write, stub, *updates))
    codes = [code_pb2.Code.Name(e.canonical_code) for e in errors]
    assert codes == [
        "OK",
        "ALREADY_EXISTS",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "NOT_FOUND",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "UNIMPLEMENTED",
        "OK",
        "OK",
        "OK",
        "RESOURCE_EXHAUSTED",
    ]
    assert "32 bits" in errors[2].message and "priority" in errors[7].message.lower()
    assert errors[1].space == "ALL-sswitch-p4org" and errors[0].space == ""


def test_atomic_modes_unimplemented(stub: Any, primary: Stream) -> None:
    exc = rpc_error(write, stub, atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR)
    assert exc.code() == grpc.StatusCode.UNIMPLEMENTED


def test_const_default_action(stub: Any, primary: Stream, test_p4info: P4InfoIndex) -> None:
    update = Update(type=Update.MODIFY)
    update.entity.table_entry.table_id = test_p4info.table_id("job_table")
    update.entity.table_entry.is_default_action = True
    errors = update_errors(rpc_error(write, stub, update))
    assert errors[0].canonical_code == code_pb2.PERMISSION_DENIED


# -- reads ----------------------------------------------------------------------------------


def test_read_back_is_canonical(
    p4rt_switch: Any, stub: Any, primary: Stream, test_p4info: P4InfoIndex
) -> None:
    write(
        stub,
        table_update(
            test_p4info,
            Update.INSERT,
            "ipv4_lpm",
            [("hdr.ipv4.dst_addr", "lpm", (b"\x00\x0a\x00\x00\x00", 8))],
            "route",
            {"port": b"\x00\x01", "src_mac": b"\x00\x00\x00\x00\x00\x02", "dst_mac": b"\x03"},
        ),
    )
    entity = p4runtime_pb2.Entity()
    entity.table_entry.table_id = test_p4info.table_id("ipv4_lpm")
    (got,) = read(stub, entity)
    assert got.table_entry.match[0].lpm.value == b"\x0a\x00\x00\x00"
    assert [p.value for p in got.table_entry.action.action.params] == [b"\x01", b"\x02", b"\x03"]
    # Default entries come only when asked for; a specific entry by its key.
    entity.table_entry.is_default_action = True
    (default,) = read(stub, entity)
    assert default.table_entry.is_default_action and not default.table_entry.HasField("action")
    entity.table_entry.is_default_action = False
    entity.table_entry.match.add(field_id=1).lpm.value = b"\x0b\x00\x00\x00"
    entity.table_entry.match[0].lpm.prefix_len = 8
    assert read(stub, entity) == []
    whole = p4runtime_pb2.Entity()
    whole.table_entry.table_id = 0
    assert len(read(stub, whole)) == 1


def test_register_read_unimplemented(stub: Any, primary: Stream) -> None:
    entity = p4runtime_pb2.Entity()
    entity.register_entry.register_id = 0
    assert rpc_error(read, stub, entity).code() == grpc.StatusCode.UNIMPLEMENTED


def test_counters(p4rt_switch: Any, stub: Any, primary: Stream, test_p4info: P4InfoIndex) -> None:
    p4rt_switch.device.counter("drop_counter").count(2, 64)
    entity = p4runtime_pb2.Entity()
    entity.counter_entry.counter_id = test_p4info.counter("drop_counter").id
    cells = read(stub, entity)
    assert len(cells) == 16 and cells[2].counter_entry.data.byte_count == 64
    entity.counter_entry.index.index = 2
    (cell,) = read(stub, entity)
    assert (cell.counter_entry.data.packet_count, cell.counter_entry.data.byte_count) == (1, 64)
    entity.counter_entry.index.index = 16
    assert rpc_error(read, stub, entity).code() == grpc.StatusCode.UNKNOWN
    update = Update(type=Update.DELETE)
    update.entity.counter_entry.counter_id = entity.counter_entry.counter_id
    update.entity.counter_entry.index.index = 2
    write(stub, update)
    assert p4rt_switch.device.counter("drop_counter").read(2) == (0, 0)
    update.type = Update.INSERT
    assert (
        update_errors(rpc_error(write, stub, update))[0].canonical_code == code_pb2.INVALID_ARGUMENT
    )


def test_direct_counters(
    p4rt_switch: Any, stub: Any, primary: Stream, test_p4info: P4InfoIndex
) -> None:
    key = [("hdr.agg.job_id", "exact", b"\x07")]
    write(
        stub,
        table_update(
            test_p4info,
            Update.INSERT,
            "job_table",
            key,
            "set_job",
            {"pool_base": b"\x01", "pool_size": b"\x02", "num_workers": b"\x03"},
        ),
    )
    p4rt_switch.device.table("job_table").lookup((7,), 100)
    entity = p4runtime_pb2.Entity()
    entity.direct_counter_entry.table_entry.table_id = test_p4info.table_id("job_table")
    (got,) = read(stub, entity)
    assert (
        got.direct_counter_entry.data.packet_count,
        got.direct_counter_entry.data.byte_count,
    ) == (1, 100)
    update = Update(type=Update.MODIFY)
    dce = update.entity.direct_counter_entry
    dce.table_entry.CopyFrom(
        table_update(test_p4info, Update.MODIFY, "job_table", key).entity.table_entry
    )
    dce.data.packet_count, dce.data.byte_count = 5, 6
    write(stub, update)
    entity.direct_counter_entry.table_entry.CopyFrom(dce.table_entry)
    (got,) = read(stub, entity)
    assert (
        got.direct_counter_entry.data.packet_count,
        got.direct_counter_entry.data.byte_count,
    ) == (5, 6)
    entity.direct_counter_entry.table_entry.table_id = test_p4info.table_id("acl")
    del entity.direct_counter_entry.table_entry.match[:]
    assert rpc_error(read, stub, entity).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_multicast_port_kinds(stub: Any, primary: Stream) -> None:
    update = Update(type=Update.INSERT)
    group = update.entity.packet_replication_engine_entry.multicast_group_entry
    group.multicast_group_id = 3
    group.replicas.add(egress_port=2, instance=2)
    group.replicas.add(port=b"\x00\x01", instance=1)
    write(stub, update)
    entity = p4runtime_pb2.Entity()
    entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
    (got,) = read(stub, entity)
    replicas = got.packet_replication_engine_entry.multicast_group_entry.replicas
    assert [(r.WhichOneof("port_kind"), r.instance) for r in replicas] == [
        ("port", 1),
        ("egress_port", 2),
    ]
    assert replicas[0].port == b"\x00\x01"
    bad = []
    for group_id, replicas_ in [(0, []), (1 << 15, []), (4, [(1, 1), (1, 1)]), (5, [(None, 1)])]:
        u = Update(type=Update.INSERT)
        g = u.entity.packet_replication_engine_entry.multicast_group_entry
        g.multicast_group_id = group_id
        for port, instance in replicas_:
            r = g.replicas.add(instance=instance)
            if port is not None:
                r.egress_port = port
        bad.append(u)
    errors = update_errors(rpc_error(write, stub, *bad))
    assert [code_pb2.Code.Name(e.canonical_code) for e in errors] == [
        "INVALID_ARGUMENT",
        "OUT_OF_RANGE",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
    ]


def test_unexpected_exceptions_become_internal(
    stub: Any, primary: Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(p4runtime_server, "read_entities", boom)
    monkeypatch.setattr(p4runtime_server, "apply_write", boom)
    entity = p4runtime_pb2.Entity()
    entity.table_entry.SetInParent()
    assert rpc_error(read, stub, entity).code() == grpc.StatusCode.INTERNAL
    assert rpc_error(write, stub).code() == grpc.StatusCode.INTERNAL


def _missing_arp_deletes(p4info: P4InfoIndex, count: int) -> list[Update]:
    return [
        table_update(
            p4info, Update.DELETE, "arp_responder", [("hdr.arp.tpa", "exact", i.to_bytes(4))]
        )
        for i in range(1, count + 1)
    ]


def _failure(exc: grpc.RpcError) -> status_pb2.Status:
    """The Status of a failed Write, checked to have arrived whole (not "Stream removed")."""
    assert exc.code() == grpc.StatusCode.UNKNOWN, (exc.code(), exc.details())
    status = status_pb2.Status.FromString(dict(exc.trailing_metadata())["grpc-status-details-bin"])
    assert exc.details() == status.message
    return status


@pytest.mark.parametrize("stock", [True, False], ids=["grpc-default-limits", "our-client"])
def test_failing_batch_errors_fit_the_client_metadata_limit(
    p4rt_switch: Any, primary: Stream, test_p4info: P4InfoIndex, stock: bool
) -> None:
    """Failing batches of 150 to 3000 updates (300 failures made ~35 KB of per-update errors,
    over gRPC's default 16 KiB) reach a client with gRPC's default metadata limits (as
    p4runtime-shell's) and ours alike, every time (between gRPC's soft limit of 8 KiB and 16
    KiB a random share of calls would end "Stream removed"): up to ~150 failures with every
    update's code, beyond that summarized."""
    options = () if stock else GRPC_OPTIONS
    with grpc.insecure_channel(p4rt_switch.address, options=options) as channel:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        for count in (150, 300, 600, 3000):
            for _ in range(5):
                exc = rpc_error(write, stub, *_missing_arp_deletes(test_p4info, count))
                status = _failure(exc)
                wire = len(exc.details()) + len(
                    dict(exc.trailing_metadata())["grpc-status-details-bin"]
                )
                assert wire < 8000
            assert status.message.startswith(f"{count} of {count} updates failed")
            if count == 150:
                errors = update_errors(exc)
                assert [e.canonical_code for e in errors] == [code_pb2.NOT_FOUND] * count
                assert errors[0].message and not errors[-1].message
                assert "messages of failures after the first 5 left out" in status.message
            else:
                assert not status.details
                assert f"by code: NOT_FOUND {count}" in status.message
                assert "first: #0 NOT_FOUND" in status.message


def test_write_failure_status_bounds() -> None:
    ok, bad = code_pb2.OK, code_pb2.ALREADY_EXISTS
    small = p4runtime_write.write_failure_status([(ok, ""), (bad, "x" * 1000)])
    errors = [p4runtime_pb2.Error() for _ in small.details]
    assert all(d.Unpack(e) for d, e in zip(small.details, errors, strict=True))
    assert [e.canonical_code for e in errors] == [ok, bad]
    assert len(errors[1].message) == p4runtime_write.MAX_ERROR_MESSAGE
    brief = p4runtime_write.write_failure_status([(ok, "")] * 20 + [(bad, "y" * 300)] * 100)
    assert len(brief.details) == 120 and brief.ByteSize() <= p4runtime_write.MAX_STATUS_BYTES
    errors = [p4runtime_pb2.Error() for _ in brief.details]
    assert all(d.Unpack(e) for d, e in zip(brief.details, errors, strict=True))
    assert [e.canonical_code for e in errors] == [ok] * 20 + [bad] * 100
    kept = [e for e in errors if e.message]
    assert len(kept) == p4runtime_write.SUMMARY_FAILURES and kept[0] is errors[20]
    big = p4runtime_write.write_failure_status([(bad, "dup " * 100)] * 100_000)
    assert not big.details and big.ByteSize() <= p4runtime_write.MAX_STATUS_BYTES
    assert len(big.message) <= p4runtime_write.MAX_STATUS_MESSAGE
    assert "ALREADY_EXISTS 100000" in big.message
