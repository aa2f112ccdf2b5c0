"""P4Runtime entities as values, shared by the controller, the reference switch and the tests.

Each kind is a frozen dataclass named by P4Info full names with int values: to_proto()
encodes it with a P4InfoIndex, from_proto() decodes it, to_entity() wraps it in an Entity
and update() in a Write Update. Values go out in canonical form (P4Runtime 1.4 §8.4),
which BMv2 and the reference switch both accept.

Match values, by the field's match kind:
    exact -> int                 lpm -> (value, prefix_len)     ternary -> (value, mask)
    range -> (low, high)         optional -> int
A field left out (or None) is "don't care" (allowed for all but exact fields); so is an lpm
prefix of 0, a ternary mask of 0, or a full range, which encoding leaves out. Decoding
follows PI (BMv2's P4Runtime server): a malformed key or action is an EntityError with the
google.rpc code and message PI reports, which the reference switch passes on as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from google.rpc import code_pb2

from homagg.p4rt import bytestrings
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.p4info import ActionInfo, MatchFieldInfo, P4InfoIndex, P4InfoLookupError, TableInfo

MatchValue = int | tuple[int, int]


class EntityError(ValueError):
    """A malformed entity message: the google.rpc canonical code and PI's message for it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> EntityError:
    return EntityError(code_pb2.INVALID_ARGUMENT, message)


class CounterData(NamedTuple):
    """A counter cell's (packets, bytes)."""

    packets: int
    nbytes: int


def _set_counter_data(target: p4runtime_pb2.CounterData, data: CounterData) -> None:
    target.packet_count, target.byte_count = data


def _counter_data(msg: p4runtime_pb2.CounterData) -> CounterData:
    return CounterData(msg.packet_count, msg.byte_count)


# -- match keys and actions ------------------------------------------------------------


def _field_match(
    table: TableInfo, name: str, value: MatchValue | None
) -> p4runtime_pb2.FieldMatch | None:
    info = table.match_field(name)
    if value is None:
        return None
    width, kind = info.bitwidth, info.match_type
    fm = p4runtime_pb2.FieldMatch(field_id=info.id)
    if kind in ("exact", "optional"):
        if not isinstance(value, int):
            raise TypeError(f"{kind} field {name} of {table.name} takes an int, got {value!r}")
        getattr(fm, kind).value = bytestrings.encode(value, width)
        return fm
    if not (
        isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value)
    ):
        what = {"lpm": "(value, prefix_len)", "ternary": "(value, mask)", "range": "(low, high)"}[
            kind
        ]
        raise TypeError(f"{kind} field {name} of {table.name} takes {what}, got {value!r}")
    a, b = value
    if kind == "lpm":
        if b == 0:
            return None
        fm.lpm.value, fm.lpm.prefix_len = bytestrings.encode(a, width), b
    elif kind == "ternary":
        if b == 0:
            return None
        fm.ternary.value = bytestrings.encode(a, width)
        fm.ternary.mask = bytestrings.encode(b, width)
    else:
        if (a, b) == (0, (1 << width) - 1):
            return None
        fm.range.low, fm.range.high = bytestrings.encode(a, width), bytestrings.encode(b, width)
    return fm


def encode_match(
    table: TableInfo, match: Mapping[str, MatchValue | None]
) -> list[p4runtime_pb2.FieldMatch]:
    """FieldMatch messages for a name -> value dict, don't cares left out (module docstring)."""
    out = []
    for name, value in match.items():
        fm = _field_match(table, name, value)
        if fm is not None:
            out.append(fm)
    return out


def decode_value(data: bytes, bitwidth: int) -> int:
    """A byte string's value; PI's INVALID_ARGUMENT when it does not fit `bitwidth` bits."""
    try:
        return bytestrings.decode(data, bitwidth)
    except ValueError:
        raise _invalid(f"Bytestring provided does not fit within {bitwidth} bits") from None


def _decode_field(info: MatchFieldInfo, fm: p4runtime_pb2.FieldMatch) -> MatchValue:
    kind, width = fm.WhichOneof("field_match_type"), info.bitwidth
    if kind != info.match_type:
        raise _invalid(
            f"Invalid match type for field {info.name}: "
            f"got {kind or 'none'}, the P4Info says {info.match_type}"
        )
    if kind == "exact":
        return decode_value(fm.exact.value, width)
    if kind == "lpm":
        if fm.lpm.prefix_len < 0:
            raise _invalid("Prefix length cannot be < 0")
        if fm.lpm.prefix_len == 0:
            raise _invalid(
                "Invalid representation of 'don't care' LPM match, "
                "omit match field instead of using a prefix length of 0"
            )
        return decode_value(fm.lpm.value, width), fm.lpm.prefix_len
    if kind == "ternary":
        mask = decode_value(fm.ternary.mask, width)
        if mask == 0:
            raise _invalid(
                "Invalid representation of 'don't care' ternary match, "
                "omit match field instead of using 0 mask"
            )
        return decode_value(fm.ternary.value, width), mask
    if kind == "range":
        low, high = decode_value(fm.range.low, width), decode_value(fm.range.high, width)
        if (low, high) == (0, (1 << width) - 1):
            raise _invalid(
                "Invalid representation of 'don't care' range match, "
                "omit match field instead of using low=0 and high=2**bitwidth-1"
            )
        return low, high
    return decode_value(fm.optional.value, width)  # optional


def decode_match(
    table: TableInfo, fields: Sequence[p4runtime_pb2.FieldMatch]
) -> dict[str, MatchValue]:
    """The name -> value dict of a key, don't cares left out; EntityError when malformed.

    The checks and their order are PI's: too many fields, a duplicate, then each P4Info
    field in turn (a missing exact field, the field's own form), then unknown field ids.
    """
    if len(fields) > len(table.match_fields):
        raise _invalid("Too many fields in match key")
    given: dict[int, p4runtime_pb2.FieldMatch] = {}
    for fm in fields:
        if fm.field_id in given:
            raise _invalid(f"Duplicate field id {fm.field_id} in match key")
        given[fm.field_id] = fm
    match: dict[str, MatchValue] = {}
    for info in table.match_fields:
        found = given.pop(info.id, None)
        if found is not None:
            match[info.name] = _decode_field(info, found)
        elif info.match_type == "exact":
            raise _invalid(f"Missing non-ternary field in match key ({info.name})")
    if given:
        raise _invalid(f"Unknown field in match key (ids {sorted(given)})")
    return match


def encode_action(action: ActionInfo, params: Mapping[str, int]) -> p4runtime_pb2.TableAction:
    """A direct TableAction; ValueError names missing or unknown parameters."""
    missing = [p.name for p in action.params if p.name not in params]
    extra = [n for n in params if n not in action.params_by_name]
    if missing or extra:
        raise ValueError(
            f"action {action.name} takes {[p.name for p in action.params]}: "
            f"missing {missing}, unknown {extra}"
        )
    ta = p4runtime_pb2.TableAction()
    ta.action.action_id = action.id
    for p in action.params:
        ta.action.params.add(param_id=p.id, value=bytestrings.encode(params[p.name], p.bitwidth))
    return ta


def decode_action(
    index: P4InfoIndex, table_action: p4runtime_pb2.TableAction
) -> tuple[ActionInfo, dict[str, int]]:
    """The action and params of a direct TableAction; EntityError for bad ids or values."""
    if table_action.WhichOneof("type") != "action":
        raise _invalid("Cannot provide indirect action for direct table")
    call = table_action.action
    try:
        action = index.action(call.action_id)
    except P4InfoLookupError:
        raise _invalid(f"Invalid P4 id: no action with id {call.action_id}") from None
    if len(call.params) != len(action.params):
        raise _invalid(
            f"Unexpected number of action parameters for {action.name}: "
            f"got {len(call.params)}, expected {len(action.params)}"
        )
    params: dict[str, int] = {}
    for p in call.params:
        info = action.params_by_id.get(p.param_id)
        if info is None:
            raise _invalid(f"Unknown action parameter id {p.param_id} for {action.name}")
        params[info.name] = decode_value(p.value, info.bitwidth)
    return action, params


# -- entities --------------------------------------------------------------------------


@dataclass(frozen=True)
class TableEntry:
    """A table entry (or, is_default, a table's default entry) by full names and ints.

    action "" is none: a DELETE, a default reset, a default entry with no action known.
    counter_data is set only when a read asked for it (or a write sets the direct counter).
    """

    table: str
    match: Mapping[str, MatchValue | None] = field(default_factory=dict)
    action: str = ""
    params: Mapping[str, int] = field(default_factory=dict)
    priority: int = 0
    is_default: bool = False
    controller_metadata: int = 0
    metadata: bytes = b""
    idle_timeout_ns: int = 0
    counter_data: CounterData | None = None

    def to_proto(self, index: P4InfoIndex) -> p4runtime_pb2.TableEntry:
        """The TableEntry message; P4InfoLookupError, TypeError or ValueError for bad values."""
        info = index.table(self.table)
        te = p4runtime_pb2.TableEntry(table_id=info.id)
        te.match.extend(encode_match(info, self.match))
        te.priority = self.priority
        te.is_default_action = self.is_default
        te.idle_timeout_ns = self.idle_timeout_ns
        if self.action:
            te.action.CopyFrom(encode_action(index.action(self.action), self.params))
        te.controller_metadata, te.metadata = self.controller_metadata, self.metadata
        if self.counter_data is not None:
            _set_counter_data(te.counter_data, self.counter_data)
        return te

    @classmethod
    def from_proto(cls, msg: p4runtime_pb2.TableEntry, index: P4InfoIndex) -> TableEntry:
        """Decode; EntityError for a malformed key or action (P4InfoLookupError: unknown table).

        An action that is not a direct one (a profile member or group) reads as none.
        """
        table = index.table(msg.table_id)
        if msg.is_default_action and len(msg.match):
            raise _invalid("Non-empty key for default entry")
        match = decode_match(table, msg.match) if not msg.is_default_action else {}
        action_name, params = "", dict[str, int]()
        if msg.action.WhichOneof("type") == "action":
            action, params = decode_action(index, msg.action)
            action_name = action.name
        counter = _counter_data(msg.counter_data) if msg.HasField("counter_data") else None
        return cls(
            table.name,
            match,
            action_name,
            params,
            msg.priority,
            msg.is_default_action,
            msg.controller_metadata,
            msg.metadata,
            msg.idle_timeout_ns,
            counter,
        )

    def to_entity(self, index: P4InfoIndex) -> p4runtime_pb2.Entity:
        """The entry as an Entity (for a Write update or a Read request or answer)."""
        return p4runtime_pb2.Entity(table_entry=self.to_proto(index))


@dataclass(frozen=True)
class CounterEntry:
    """Cells of an indirect counter: `index` None is every cell (a read); `data` None asks."""

    counter: str
    index: int | None = None
    data: CounterData | None = None

    def to_proto(self, index: P4InfoIndex) -> p4runtime_pb2.CounterEntry:
        """The CounterEntry message; P4InfoLookupError for an unknown counter."""
        ce = p4runtime_pb2.CounterEntry(counter_id=index.counter(self.counter).id)
        if self.index is not None:
            ce.index.index = self.index
        if self.data is not None:
            _set_counter_data(ce.data, self.data)
        return ce

    @classmethod
    def from_proto(cls, msg: p4runtime_pb2.CounterEntry, index: P4InfoIndex) -> CounterEntry:
        """Decode; P4InfoLookupError for an unknown counter."""
        return cls(
            index.counter(msg.counter_id).name,
            msg.index.index if msg.HasField("index") else None,
            _counter_data(msg.data) if msg.HasField("data") else None,
        )

    def to_entity(self, index: P4InfoIndex) -> p4runtime_pb2.Entity:
        """The cell(s) as an Entity."""
        return p4runtime_pb2.Entity(counter_entry=self.to_proto(index))


@dataclass(frozen=True)
class DirectCounterEntry:
    """The direct counter of one table entry (`entry` has no action)."""

    entry: TableEntry
    data: CounterData | None = None

    def to_proto(self, index: P4InfoIndex) -> p4runtime_pb2.DirectCounterEntry:
        """The DirectCounterEntry message."""
        dce = p4runtime_pb2.DirectCounterEntry(table_entry=self.entry.to_proto(index))
        if self.data is not None:
            _set_counter_data(dce.data, self.data)
        return dce

    @classmethod
    def from_proto(
        cls, msg: p4runtime_pb2.DirectCounterEntry, index: P4InfoIndex
    ) -> DirectCounterEntry:
        """Decode (see TableEntry.from_proto)."""
        data = _counter_data(msg.data) if msg.HasField("data") else None
        return cls(TableEntry.from_proto(msg.table_entry, index), data)

    def to_entity(self, index: P4InfoIndex) -> p4runtime_pb2.Entity:
        """The counter as an Entity."""
        return p4runtime_pb2.Entity(direct_counter_entry=self.to_proto(index))


def replica_port(replica: p4runtime_pb2.Replica) -> int:
    """The egress port of a replica, whether sent as the uint32 egress_port or as `port` bytes."""
    if replica.WhichOneof("port_kind") == "port":
        return int.from_bytes(replica.port, "big")
    return replica.egress_port


@dataclass(frozen=True)
class MulticastGroupEntry:
    """A multicast group: id and (port, instance) replicas, in the order sent or read.

    port_widths gives the replicas sent as `port` bytes their byte count (others go as the
    uint32 egress_port, which every PI version accepts); it is not part of the value.
    """

    group_id: int
    replicas: tuple[tuple[int, int], ...] = ()
    port_widths: Mapping[tuple[int, int], int] = field(default_factory=dict, compare=False)

    def to_proto(self, index: P4InfoIndex | None = None) -> p4runtime_pb2.MulticastGroupEntry:
        """The MulticastGroupEntry message (no P4Info needed)."""
        group = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=self.group_id)
        for port, instance in self.replicas:
            width = self.port_widths.get((port, instance), 0)
            if width:
                group.replicas.add(port=port.to_bytes(width, "big"), instance=instance)
            else:
                group.replicas.add(egress_port=port, instance=instance)
        return group

    @classmethod
    def from_proto(
        cls, msg: p4runtime_pb2.MulticastGroupEntry, index: P4InfoIndex | None = None
    ) -> MulticastGroupEntry:
        """Decode leniently (the reference switch checks replicas on writes itself)."""
        replicas = tuple((replica_port(r), r.instance) for r in msg.replicas)
        widths = {
            (replica_port(r), r.instance): len(r.port)
            for r in msg.replicas
            if r.WhichOneof("port_kind") == "port"
        }
        return cls(msg.multicast_group_id, replicas, widths)

    def to_entity(self, index: P4InfoIndex | None = None) -> p4runtime_pb2.Entity:
        """The group as an Entity."""
        pre = p4runtime_pb2.PacketReplicationEngineEntry(multicast_group_entry=self.to_proto())
        return p4runtime_pb2.Entity(packet_replication_engine_entry=pre)


Entity = TableEntry | CounterEntry | DirectCounterEntry | MulticastGroupEntry


def update(kind: int, value: Entity, index: P4InfoIndex) -> p4runtime_pb2.Update:
    """A Write Update of type `kind` (Update.INSERT, MODIFY or DELETE) carrying `value`."""
    update_type = p4runtime_pb2.Update.Type.Name(kind)
    return p4runtime_pb2.Update(type=update_type, entity=value.to_entity(index))
