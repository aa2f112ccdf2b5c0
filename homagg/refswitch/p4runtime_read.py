"""P4Runtime Read: builds the entities a ReadRequest asks for from a Device, as PI does.

Values go out in canonical form (shortest big-endian, at least one byte); don't-care
fields are omitted; a wildcard table read returns the entries but not the default
entry (read that with is_default_action set), like PI.
"""

from __future__ import annotations

from google.rpc import code_pb2

from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.entities import (
    CounterData,
    CounterEntry,
    DirectCounterEntry,
    MulticastGroupEntry,
    TableEntry,
)
from homagg.p4rt.p4info import P4InfoIndex
from homagg.refswitch.device import Counter, Device, DeviceError, Table
from homagg.refswitch.p4runtime_write import (
    FIRST_RESERVED_GROUP_ID,
    counter_of,
    decode_match,
    direct_entry_of,
    invalid,
    table_of,
)
from homagg.refswitch.table import Entry

_UNSUPPORTED_READS = {
    "extern_entry": "Extern entry reads are",
    "action_profile_member": "Action profile member reads are",
    "action_profile_group": "Action profile group reads are",
    "meter_entry": "Meter reads are",
    "direct_meter_entry": "Direct meter reads are",
    "value_set_entry": "ValueSet reads are",
    "register_entry": "Register reads are",
    "digest_entry": "Digest reads are",
}


def read_entities(device: Device, request: p4runtime_pb2.ReadRequest) -> list[p4runtime_pb2.Entity]:
    """Every entity matching the request; DeviceError (the whole read fails) on the first bad."""
    out: list[p4runtime_pb2.Entity] = []
    with device.lock:
        for entity in request.entities:
            kind = entity.WhichOneof("entity")
            if kind == "table_entry":
                _read_tables(device, entity.table_entry, out)
            elif kind == "counter_entry":
                _read_counters(device, entity.counter_entry, out)
            elif kind == "direct_counter_entry":
                _read_direct_counters(device, entity.direct_counter_entry, out)
            elif kind == "packet_replication_engine_entry":
                _read_pre(device, entity.packet_replication_engine_entry, out)
            elif kind in _UNSUPPORTED_READS:
                raise DeviceError(
                    code_pb2.UNIMPLEMENTED, f"{_UNSUPPORTED_READS[kind]} not supported yet"
                )
            else:
                raise DeviceError(code_pb2.UNKNOWN, "Incorrect entity type")
    return out


# -- table entries -------------------------------------------------------------------


def _table_entry(
    table: Table, entry: Entry, with_counter: bool, default: bool = False
) -> p4runtime_pb2.Entity:
    counter = (
        CounterData(entry.packets, entry.bytes) if with_counter and table.has_counter else None
    )
    value = TableEntry(
        table.name,
        {} if default else table.named_match(entry.match),
        entry.action_name if entry.action.id else "",  # id 0: no default action known
        entry.params,
        0 if default else entry.priority,
        default,
        entry.controller_metadata,
        entry.metadata,
        0 if default else entry.idle_timeout_ns,
        counter,
    )
    return value.to_entity(table.p4info)


def _read_tables(
    device: Device, request: p4runtime_pb2.TableEntry, out: list[p4runtime_pb2.Entity]
) -> None:
    if request.HasField("time_since_last_hit"):
        raise invalid(
            "Do not set time_since_last_hit for a ReadRequest if the table does not "
            "support idle timeout"
        )
    tables = device.tables() if request.table_id == 0 else [table_of(device, request.table_id)]
    with_counter = request.HasField("counter_data")
    for table in tables:
        if request.is_default_action:
            out.append(_table_entry(table, table.default, with_counter, default=True))
        elif len(request.match):
            # One entry by key (BMv2's PI cannot do this and answers UNKNOWN; we filter).
            entry = table.get(*decode_match(table, request))
            if entry is not None:
                out.append(_table_entry(table, entry, with_counter))
        else:
            out.extend(_table_entry(table, e, with_counter) for e in table.entries())


# -- counters ----------------------------------------------------------------------


def _counter_entity(p4info: P4InfoIndex, counter: Counter, index: int) -> p4runtime_pb2.Entity:
    # BMv2 reports both packets and bytes, whatever the unit
    data = CounterData(counter.packets[index], counter.bytes[index])
    return CounterEntry(counter.info.name, index, data).to_entity(p4info)


def _read_counters(
    device: Device, request: p4runtime_pb2.CounterEntry, out: list[p4runtime_pb2.Entity]
) -> None:
    counters = (
        device.counters() if request.counter_id == 0 else [counter_of(device, request.counter_id)]
    )
    p4info = device.p4info
    assert p4info is not None, "caller checks that a pipeline is set"
    for counter in counters:
        if request.HasField("index"):
            index = request.index.index
            if index < 0:
                raise invalid("A negative number is not a valid index value")
            if index >= counter.size:
                raise DeviceError(code_pb2.UNKNOWN, "Error when reading counter from target")
            out.append(_counter_entity(p4info, counter, index))
        else:
            out.extend(_counter_entity(p4info, counter, i) for i in range(counter.size))


def _direct_entity(
    table: Table, entry: Entry, request: p4runtime_pb2.TableEntry | None
) -> p4runtime_pb2.Entity:
    data = CounterData(entry.packets, entry.bytes)
    if request is not None:  # a single entry: PI echoes the request's table entry
        dce = p4runtime_pb2.DirectCounterEntry(table_entry=request)
        dce.data.packet_count, dce.data.byte_count = data
        return p4runtime_pb2.Entity(direct_counter_entry=dce)
    key = TableEntry(table.name, table.named_match(entry.match), priority=entry.priority)
    return DirectCounterEntry(key, data).to_entity(table.p4info)


def _read_direct_counters(
    device: Device, request: p4runtime_pb2.DirectCounterEntry, out: list[p4runtime_pb2.Entity]
) -> None:
    if not request.HasField("table_entry"):
        raise invalid("Missing table_entry field in DirectCounterEntry")
    te = request.table_entry
    if te.table_id == 0:
        raise DeviceError(
            code_pb2.UNIMPLEMENTED,
            "Reading all direct counters for ALL tables is not supported yet",
        )
    if len(te.match) or te.is_default_action:
        table, entry = direct_entry_of(device, te)
        out.append(_direct_entity(table, entry, te))
        return
    table = table_of(device, te.table_id)
    if not table.has_counter:
        raise invalid("Table has no direct counters")
    out.extend(_direct_entity(table, e, None) for e in table.entries())


# -- packet replication engine ------------------------------------------------------


def _group_entity(device: Device, group_id: int) -> p4runtime_pb2.Entity:
    replicas = tuple(device.multicast_groups[group_id])
    widths = device.multicast_port_widths.get(group_id, {})
    return MulticastGroupEntry(group_id, replicas, widths).to_entity()


def _read_pre(
    device: Device,
    request: p4runtime_pb2.PacketReplicationEngineEntry,
    out: list[p4runtime_pb2.Entity],
) -> None:
    kind = request.WhichOneof("type")
    if kind == "clone_session_entry":
        raise DeviceError(
            code_pb2.UNIMPLEMENTED, "Clone sessions are not supported by this switch model"
        )
    if kind != "multicast_group_entry":
        raise invalid("Invalid PRE operation")
    group_id = request.multicast_group_entry.multicast_group_id
    if group_id >= FIRST_RESERVED_GROUP_ID:
        raise DeviceError(code_pb2.OUT_OF_RANGE, "Group id value is too high")
    if group_id == 0:
        out.extend(_group_entity(device, g) for g in sorted(device.multicast_groups))
    elif group_id in device.multicast_groups:
        out.append(_group_entity(device, group_id))
    else:
        raise DeviceError(code_pb2.NOT_FOUND, "Multicast group does not exist")
