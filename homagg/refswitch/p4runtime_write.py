"""P4Runtime Write: applies each update of a WriteRequest to a Device, as PI (BMv2's server) does.

CONTINUE_ON_ERROR semantics: every update is tried; each yields a (google.rpc code,
message) pair. The canonical codes and most messages follow PI's DeviceMgr.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator

from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2

from homagg.p4rt import entities
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.entities import EntityError
from homagg.p4rt.p4info import ActionInfo, P4InfoIndex, P4InfoLookupError
from homagg.refswitch.device import Counter, Device, DeviceError, Table
from homagg.refswitch.table import Entry, FieldMatch

log = logging.getLogger(__name__)
ERROR_SPACE = "ALL-sswitch-p4org"  # PI's error space for target errors
# A failing Write's status travels in trailers: the google.rpc.Status with one p4.v1.Error per
# update (grpc-status-details-bin) and its message again (grpc-message). A stock gRPC client
# (e.g. p4runtime-shell) refuses metadata over 16 KiB and, between its soft limit of 8 KiB and
# that, rejects a random share ("Stream removed"); so the Status stays within
# MAX_STATUS_BYTES and its message within MAX_STATUS_MESSAGE, below the soft limit together.
# Our own client accepts 1 MiB (homagg.p4rt.api.GRPC_OPTIONS), e.g. for PI's unbounded statuses.
MAX_STATUS_BYTES = 6656
MAX_STATUS_MESSAGE = 1 << 10  # characters (a summary; the other messages are far shorter)
MAX_ERROR_MESSAGE = 200  # characters of one update's error message
SUMMARY_FAILURES = 5  # failures whose messages are kept when the others' are left out

Update = p4runtime_pb2.Update
FIRST_RESERVED_GROUP_ID = 1 << 15  # PI keeps groups at or above this for clone sessions
_UNSUPPORTED_WRITES = {
    "extern_entry": "Extern entries",
    "action_profile_member": "Action profile members",
    "action_profile_group": "Action profile groups",
    "meter_entry": "Meter entries",
    "direct_meter_entry": "Direct meter entries",
    "value_set_entry": "ValueSet writes",
    "register_entry": "Register writes",
    "digest_entry": "Digest configuration",
}


def error(code: int, message: str) -> DeviceError:
    """A per-update error (alias kept short for the many raise sites)."""
    return DeviceError(code, message)


def invalid(message: str) -> DeviceError:
    """An INVALID_ARGUMENT per-update error."""
    return DeviceError(code_pb2.INVALID_ARGUMENT, message)


def apply_write(device: Device, request: p4runtime_pb2.WriteRequest) -> list[tuple[int, str]]:
    """Apply every update under device.lock; one (code, message) per update, OK = 0."""
    results: list[tuple[int, str]] = []
    with device.lock:
        p4info = device.p4info
        assert p4info is not None, "caller checks that a pipeline is set"
        for update in request.updates:
            try:
                _apply_update(device, p4info, update)
                results.append((code_pb2.OK, ""))
            except DeviceError as exc:
                results.append((exc.code, exc.message))
            except Exception:  # one bad update must not fail its batch
                log.exception("P4Runtime write of %s failed", update.entity.WhichOneof("entity"))
                results.append((code_pb2.INTERNAL, "Internal error while applying this update"))
    return results


def _apply_update(device: Device, p4info: P4InfoIndex, update: p4runtime_pb2.Update) -> None:
    kind = update.entity.WhichOneof("entity")
    if kind == "table_entry":
        _write_table_entry(device, p4info, update.type, update.entity.table_entry)
    elif kind == "counter_entry":
        _write_counter(device, update.type, update.entity.counter_entry)
    elif kind == "direct_counter_entry":
        _write_direct_counter(device, p4info, update.type, update.entity.direct_counter_entry)
    elif kind == "packet_replication_engine_entry":
        _write_pre(device, update.type, update.entity.packet_replication_engine_entry)
    elif kind in _UNSUPPORTED_WRITES:
        raise error(code_pb2.UNIMPLEMENTED, f"{_UNSUPPORTED_WRITES[kind]} are not supported yet")
    else:
        raise error(code_pb2.UNKNOWN, "Incorrect entity type")


def _check_type(update_type: int) -> None:
    if update_type == Update.UNSPECIFIED:
        raise invalid("Update type is not set")
    if update_type not in (Update.INSERT, Update.MODIFY, Update.DELETE):
        raise invalid("Invalid update type")


def table_of(device: Device, table_id: int) -> Table:
    """The table with this id; INVALID_ARGUMENT ("Invalid P4 id") when unknown."""
    try:
        return device.table_by_id(table_id)
    except (P4InfoLookupError, KeyError):
        raise invalid(f"Invalid P4 id: no table with id {table_id}") from None


# -- table entries -----------------------------------------------------------------


@contextlib.contextmanager
def entity_errors() -> Iterator[None]:
    """Report a malformed entity (homagg.p4rt.entities.EntityError) as this update's error."""
    try:
        yield
    except EntityError as exc:
        raise DeviceError(exc.code, exc.message) from None


def decode_match(
    table: Table, entry: p4runtime_pb2.TableEntry
) -> tuple[tuple[FieldMatch, ...], int]:
    """The (match, priority) of a non-default entry; INVALID_ARGUMENT for a malformed key."""
    with entity_errors():
        match = table.match_of(entities.decode_match(table.info, entry.match))
    table.check_match(match, entry.priority)
    return match, entry.priority


def decode_action(
    p4info: P4InfoIndex, table_action: p4runtime_pb2.TableAction
) -> tuple[ActionInfo, dict[str, int]]:
    """The action and params of a direct TableAction; INVALID_ARGUMENT for bad ids or values."""
    with entity_errors():
        return entities.decode_action(p4info, table_action)


def _check_entry_extras(table: Table, entry: p4runtime_pb2.TableEntry) -> None:
    if entry.HasField("time_since_last_hit"):
        raise invalid("has_time_since_last_hit must not be set in WriteRequest")
    if entry.HasField("meter_config") or entry.HasField("meter_counter_data"):
        raise invalid("Table has no direct meters")
    if entry.HasField("counter_data") and not table.has_counter:
        raise invalid("Table has no direct counters")
    if entry.idle_timeout_ns < 0:
        raise invalid("idle_timeout_ns must be a positive value")
    if entry.idle_timeout_ns > 0:
        raise invalid(
            "idle_timeout_ns must be set to 0 for tables which do not support idle timeout"
        )


def _store_extras(entry: Entry, msg: p4runtime_pb2.TableEntry) -> None:
    entry.controller_metadata = msg.controller_metadata
    entry.metadata = msg.metadata
    if msg.HasField("counter_data"):
        entry.packets = msg.counter_data.packet_count
        entry.bytes = msg.counter_data.byte_count


def _write_table_entry(
    device: Device, p4info: P4InfoIndex, update_type: int, msg: p4runtime_pb2.TableEntry
) -> None:
    table = table_of(device, msg.table_id)
    _check_type(update_type)
    _check_entry_extras(table, msg)
    if msg.is_default_action:
        if update_type == Update.INSERT:
            raise invalid("Cannot use INSERT for default entry")
        if update_type == Update.DELETE:
            raise invalid("Cannot use DELETE for default entry")
        if len(msg.match):
            raise invalid("Non-empty key for default entry")
        if msg.priority:
            raise invalid("Non-zero priority for default entry")
        table.check_default_writable()
        if msg.HasField("action"):
            action, params = decode_action(p4info, msg.action)
            table.set_default(action, params)
        else:
            table.reset_default()
        _store_extras(table.default, msg)
        return
    match, priority = decode_match(table, msg)
    if update_type == Update.DELETE:
        table.delete(match, priority)
        return
    if not msg.HasField("action"):
        raise invalid("'action' field must be set")
    action, params = decode_action(p4info, msg.action)
    if update_type == Update.INSERT:
        entry = table.insert(match, action, params, priority)
    else:
        entry = table.modify(match, action, params, priority)
    _store_extras(entry, msg)


# -- counters ----------------------------------------------------------------------


def counter_of(device: Device, counter_id: int) -> Counter:
    """The indirect counter with this id; INVALID_ARGUMENT when unknown (or a direct counter)."""
    try:
        return device.counter_by_id(counter_id)
    except (P4InfoLookupError, KeyError):
        p4info = device.p4info
        if p4info is not None and counter_id in p4info.direct_counters.by_id:
            raise invalid("Cannot use CounterEntry with a direct counter") from None
        raise invalid(f"Invalid P4 id: no counter with id {counter_id}") from None


def _merge(
    unit: str, data: p4runtime_pb2.CounterData, packets: int, nbytes: int
) -> tuple[int, int]:
    """New (packets, bytes) for a MODIFY: only the unit's fields are written, as PI does on BMv2."""
    if unit in ("packets", "both"):
        packets = data.packet_count
    if unit in ("bytes", "both"):
        nbytes = data.byte_count
    return packets, nbytes


def _write_counter(device: Device, update_type: int, msg: p4runtime_pb2.CounterEntry) -> None:
    counter = counter_of(device, msg.counter_id)
    if not msg.HasField("index"):
        raise error(
            code_pb2.UNIMPLEMENTED, "Wildcard write is not supported for indirect counters yet"
        )
    index = msg.index.index
    if index < 0:
        raise invalid("A negative number is not a valid index value")
    _check_type(update_type)
    if update_type == Update.INSERT:
        raise invalid("INSERT update type not supported for counters")
    try:
        current = counter.read(index)
    except IndexError:
        raise error(code_pb2.UNKNOWN, "Error when writing to counter") from None
    if update_type == Update.DELETE:  # PI resets the cell
        counter.write(index, 0, 0)
    else:
        counter.write(index, *_merge(counter.info.unit, msg.data, *current))


def direct_entry_of(device: Device, msg: p4runtime_pb2.TableEntry) -> tuple[Table, Entry]:
    """The table and entry (possibly the default one) a DirectCounterEntry names."""
    table = table_of(device, msg.table_id)
    if not table.has_counter:
        raise invalid("Table has no direct counters")
    if msg.is_default_action:
        return table, table.default
    match, priority = decode_match(table, msg)
    entry = table.get(match, priority)
    if entry is None:
        raise error(code_pb2.NOT_FOUND, "Cannot map table entry to handle")
    return table, entry


def _write_direct_counter(
    device: Device, p4info: P4InfoIndex, update_type: int, msg: p4runtime_pb2.DirectCounterEntry
) -> None:
    if not msg.HasField("table_entry"):
        raise invalid("Missing table_entry field in DirectCounterEntry")
    table, entry = direct_entry_of(device, msg.table_entry)
    _check_type(update_type)
    if update_type == Update.INSERT:
        raise invalid("INSERT update type not supported for counters")
    if update_type == Update.DELETE:
        entry.packets = entry.bytes = 0
        return
    unit = p4info.direct_counter(table.info.direct_counter_id).unit
    entry.packets, entry.bytes = _merge(unit, msg.data, entry.packets, entry.bytes)


# -- packet replication engine ----------------------------------------------------------


def _replica_port(replica: p4runtime_pb2.Replica) -> tuple[int, int]:
    """(port, width): width 0 for the uint32 egress_port, else the length of the `port` bytes."""
    kind = replica.WhichOneof("port_kind")
    if kind == "egress_port":
        return replica.egress_port, 0
    if kind != "port":
        raise invalid("Missing port in multicast group replica")
    data = replica.port
    if not data:
        raise invalid("Port must not be the empty string")
    if len(data) > 4:
        raise error(
            code_pb2.UNIMPLEMENTED, f"Got port of {len(data)} bytes, but only 4 bytes are supported"
        )
    port = int.from_bytes(data, "big")
    if port == 0 or port >= 1 << 31:  # PI reads the bytes as a signed int and wants it > 0
        raise invalid("Port must be non-negative.")
    return port, len(data)


def _write_pre(
    device: Device, update_type: int, msg: p4runtime_pb2.PacketReplicationEngineEntry
) -> None:
    kind = msg.WhichOneof("type")
    if kind == "clone_session_entry":
        raise error(code_pb2.UNIMPLEMENTED, "Clone sessions are not supported by this switch model")
    if kind != "multicast_group_entry":
        raise invalid("Invalid PRE operation")
    group = msg.multicast_group_entry
    group_id = group.multicast_group_id
    if group_id == 0:
        raise invalid("0 is not a valid group id")
    if group_id >= FIRST_RESERVED_GROUP_ID:
        raise error(code_pb2.OUT_OF_RANGE, "Group id value is too high")
    _check_type(update_type)
    if update_type == Update.DELETE:
        if group_id not in device.multicast_groups:
            raise error(code_pb2.NOT_FOUND, "Multicast group does not exist")
        del device.multicast_groups[group_id]
        device.multicast_port_widths.pop(group_id, None)
        return
    widths: dict[tuple[int, int], int] = {}
    for replica in group.replicas:
        if len(replica.backup_replicas):
            raise error(code_pb2.UNIMPLEMENTED, "Backup replicas are not supported")
        port, width = _replica_port(replica)
        if (port, replica.instance) in widths:
            raise invalid("Duplicate replica in multicast group")
        widths[(port, replica.instance)] = width
    exists = group_id in device.multicast_groups
    if update_type == Update.INSERT and exists:
        raise error(code_pb2.ALREADY_EXISTS, "Multicast group already exists")
    if update_type == Update.MODIFY and not exists:
        raise error(code_pb2.NOT_FOUND, "Multicast group does not exist")
    # PI keeps replicas by instance, then port: a read returns them in that order.
    device.multicast_groups[group_id] = sorted(widths, key=lambda pr: (pr[1], pr[0]))
    device.multicast_port_widths[group_id] = widths


def write_failure_status(results: list[tuple[int, str]]) -> status_pb2.Status:
    """The status of a Write with failed updates: one p4.v1.Error per update, in order, as PI
    sends, within MAX_STATUS_BYTES. Beyond, the messages of all but the first failures are left
    out, and the error space (every update keeps its code, which clients act on: ~150 failures
    fit); beyond that too, the per-update
    errors are left out and the message summarizes them (count per code, the first failures),
    so the trailers stay within what stock clients accept instead of ending the call."""
    failed = [(i, code, msg) for i, (code, msg) in enumerate(results) if code != code_pb2.OK]
    status = status_pb2.Status(
        code=code_pb2.UNKNOWN, message=f"{len(failed)} of {len(results)} updates failed"
    )
    budget = MAX_STATUS_BYTES - status.ByteSize() - 200  # room for the note below
    for keep_messages in (len(failed), SUMMARY_FAILURES):
        details = _packed_errors(results, keep_messages, budget)
        if details is not None:
            status.details.extend(details)
            if keep_messages < len(failed):
                status.message += (
                    f" (messages of failures after the first {keep_messages} left out, "
                    f"{MAX_STATUS_BYTES} bytes at most; every update's code is listed)"
                )
            return status
    by_code = collections.Counter(code_pb2.Code.Name(code) for _, code, _ in failed)
    first = "; ".join(
        f"#{i} {code_pb2.Code.Name(code)}: {msg[:100]}"
        for i, code, msg in failed[:SUMMARY_FAILURES]
    )
    status.message += (
        f" (per-update errors left out: more than {MAX_STATUS_BYTES} bytes); by code: "
        + ", ".join(f"{name} {n}" for name, n in by_code.most_common())
        + f"; first: {first}"
    )
    status.message = status.message[:MAX_STATUS_MESSAGE]
    return status


def _packed_errors(
    results: list[tuple[int, str]], keep_messages: int, budget: int
) -> list[any_pb2.Any] | None:
    """One packed p4.v1.Error per update, message and space only for the first `keep_messages`
    failures; None as soon as they exceed `budget` bytes."""
    packed_errors, size, failures = [], 0, 0
    for code, message in results:
        err = p4runtime_pb2.Error(canonical_code=code)
        if code != code_pb2.OK:
            if failures < keep_messages:
                err.space, err.message = ERROR_SPACE, message[:MAX_ERROR_MESSAGE]
            failures += 1
        packed = any_pb2.Any()
        packed.Pack(err)
        size += packed.ByteSize() + 3  # field tag and length
        if size > budget:
            return None
        packed_errors.append(packed)
    return packed_errors
