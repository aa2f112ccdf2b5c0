"""P4Runtime entities by name: build Write updates and decode Read results with a P4Info.

Match values, by the field's match kind:
    exact -> int                 lpm -> (value, prefix_len)     ternary -> (value, mask)
    range -> (low, high)         optional -> int
A field left out of the dict is "don't care" (allowed for all but exact fields); so is
an lpm prefix of 0, a ternary mask of 0, or a full range, which are left out for you.
Values are sent in canonical form (P4Runtime 1.4 §8.4), which BMv2 and the reference
switch both accept.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from homagg.p4rt import bytestrings
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.p4info import ActionInfo, P4InfoIndex, TableInfo

MatchValue = int | tuple[int, int]
Update = p4runtime_pb2.Update


@dataclass
class TableEntry:
    """A table entry decoded with the P4Info: full table/action names, ints, don't-care fields
    left out."""

    table: str
    match: dict[str, MatchValue]
    action: str
    params: dict[str, int] = field(default_factory=dict)
    priority: int = 0
    is_default: bool = False


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
    """FieldMatch messages for a name -> value dict (see the module docstring)."""
    out = []
    for name, value in match.items():
        fm = _field_match(table, name, value)
        if fm is not None:
            out.append(fm)
    return out


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


def decode_table_entry(p4info: P4InfoIndex, te: p4runtime_pb2.TableEntry) -> TableEntry:
    """A read TableEntry message -> TableEntry (names and ints)."""
    table = p4info.table(te.table_id)
    match: dict[str, MatchValue] = {}
    for fm in te.match:
        info = table.match_field(fm.field_id)
        kind, width = fm.WhichOneof("field_match_type"), info.bitwidth
        if kind == "exact":
            match[info.name] = bytestrings.decode(fm.exact.value, width)
        elif kind == "optional":
            match[info.name] = bytestrings.decode(fm.optional.value, width)
        elif kind == "lpm":
            match[info.name] = (bytestrings.decode(fm.lpm.value, width), fm.lpm.prefix_len)
        elif kind == "ternary":
            match[info.name] = (
                bytestrings.decode(fm.ternary.value, width),
                bytestrings.decode(fm.ternary.mask, width),
            )
        elif kind == "range":
            match[info.name] = (
                bytestrings.decode(fm.range.low, width),
                bytestrings.decode(fm.range.high, width),
            )
    action_name, params = "", {}
    if te.action.WhichOneof("type") == "action":
        action = p4info.action(te.action.action.action_id)
        action_name = action.name
        params = {
            action.param(p.param_id).name: bytestrings.decode(
                p.value, action.param(p.param_id).bitwidth
            )
            for p in te.action.action.params
        }
    return TableEntry(table.name, match, action_name, params, te.priority, te.is_default_action)


def replica_port(replica: p4runtime_pb2.Replica) -> int:
    """The egress port of a replica, whether sent as the uint32 egress_port or as `port` bytes."""
    if replica.WhichOneof("port_kind") == "port":
        return int.from_bytes(replica.port, "big")
    return replica.egress_port


class WriteBatch:
    """Builds the updates of one WriteRequest; each method returns the batch, so calls chain.

    conn.write_batch(conn.batch().insert_entry(...).delete_entry(...))
    """

    def __init__(self, p4info: P4InfoIndex) -> None:
        self.p4info = p4info
        self.updates: list[p4runtime_pb2.Update] = []

    def __len__(self) -> int:
        return len(self.updates)

    def __iter__(self) -> Iterator[p4runtime_pb2.Update]:
        return iter(self.updates)

    def add(self, update: p4runtime_pb2.Update) -> WriteBatch:
        """Append a ready-made Update (for entities this builder has no method for)."""
        self.updates.append(update)
        return self

    def _table_update(
        self,
        kind: int,
        table: str,
        match: Mapping[str, MatchValue | None],
        priority: int,
        action: str | None = None,
        params: Mapping[str, int] | None = None,
    ) -> WriteBatch:
        info = self.p4info.table(table)
        update = Update(type=Update.Type.Name(kind))
        te = update.entity.table_entry
        te.table_id = info.id
        te.match.extend(encode_match(info, match))
        te.priority = priority
        if action is not None:
            te.action.CopyFrom(encode_action(self.p4info.action(action), params or {}))
        return self.add(update)

    def insert_entry(
        self,
        table: str,
        match: Mapping[str, MatchValue | None],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
    ) -> WriteBatch:
        """INSERT a table entry."""
        return self._table_update(Update.INSERT, table, match, priority, action, params)

    def modify_entry(
        self,
        table: str,
        match: Mapping[str, MatchValue | None],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
    ) -> WriteBatch:
        """MODIFY the action of a table entry."""
        return self._table_update(Update.MODIFY, table, match, priority, action, params)

    def delete_entry(
        self, table: str, match: Mapping[str, MatchValue | None], priority: int = 0
    ) -> WriteBatch:
        """DELETE a table entry."""
        return self._table_update(Update.DELETE, table, match, priority)

    def set_default_action(
        self, table: str, action: str, params: Mapping[str, int] | None = None
    ) -> WriteBatch:
        """MODIFY the default entry (the action taken on a miss)."""
        update = Update(type=Update.MODIFY)
        te = update.entity.table_entry
        te.table_id = self.p4info.table_id(table)
        te.is_default_action = True
        te.action.CopyFrom(encode_action(self.p4info.action(action), params or {}))
        return self.add(update)

    def reset_default_action(self, table: str) -> WriteBatch:
        """Restore the program's initial default action (default MODIFY without action)."""
        update = Update(type=Update.MODIFY)
        update.entity.table_entry.table_id = self.p4info.table_id(table)
        update.entity.table_entry.is_default_action = True
        return self.add(update)

    def multicast_group(
        self, kind: int, group_id: int, replicas: Sequence[tuple[int, int]] = ()
    ) -> WriteBatch:
        """INSERT, MODIFY or DELETE (Update.*) a multicast group of (port, instance) replicas."""
        update = Update(type=Update.Type.Name(kind))
        group = update.entity.packet_replication_engine_entry.multicast_group_entry
        group.multicast_group_id = group_id
        for port, instance in replicas:
            # The uint32 egress_port: accepted by every PI version, old and new.
            group.replicas.add(egress_port=port, instance=instance)
        return self.add(update)

    def write_counter(self, name: str, index: int, packets: int = 0, nbytes: int = 0) -> WriteBatch:
        """Set one cell of an indirect counter (MODIFY; 0, 0 resets it)."""
        update = Update(type=Update.MODIFY)
        ce = update.entity.counter_entry
        ce.counter_id = self.p4info.counter(name).id
        ce.index.index = index
        ce.data.packet_count, ce.data.byte_count = packets, nbytes
        return self.add(update)

    def write_direct_counter(
        self,
        table: str,
        match: Mapping[str, MatchValue | None],
        packets: int = 0,
        nbytes: int = 0,
        priority: int = 0,
    ) -> WriteBatch:
        """Set the direct counter of one entry (MODIFY; 0, 0 resets it)."""
        info = self.p4info.table(table)
        update = Update(type=Update.MODIFY)
        dce = update.entity.direct_counter_entry
        dce.table_entry.table_id = info.id
        dce.table_entry.match.extend(encode_match(info, match))
        dce.table_entry.priority = priority
        dce.data.packet_count, dce.data.byte_count = packets, nbytes
        return self.add(update)
