"""A name/id index over a P4Info message, shared by the switch and the controller.

Every lookup accepts an entity's full name (preamble.name), its alias, a dotted suffix of
its full name that no other entity shares, or its numeric id, so callers can write
"ipv4_lpm" or "SwitchIngress.forwarding.ipv4_lpm" alike, and the same names address the
TNA program, whose P4Info puts the pipeline's name first ("pipe.SwitchIngress...").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from google.protobuf import text_format

from homagg.p4rt.api import p4info_pb2

MATCH_TYPES = {
    p4info_pb2.MatchField.EXACT: "exact",
    p4info_pb2.MatchField.LPM: "lpm",
    p4info_pb2.MatchField.TERNARY: "ternary",
    p4info_pb2.MatchField.RANGE: "range",
    p4info_pb2.MatchField.OPTIONAL: "optional",
}
COUNTER_UNITS = {
    p4info_pb2.CounterSpec.UNSPECIFIED: "unspecified",
    p4info_pb2.CounterSpec.BYTES: "bytes",
    p4info_pb2.CounterSpec.PACKETS: "packets",
    p4info_pb2.CounterSpec.BOTH: "both",
}
SCOPES = {
    p4info_pb2.ActionRef.TABLE_AND_DEFAULT: "table_and_default",
    p4info_pb2.ActionRef.TABLE_ONLY: "table_only",
    p4info_pb2.ActionRef.DEFAULT_ONLY: "default_only",
}


class P4InfoLookupError(KeyError):
    """An unknown name or id; the message lists the names that are known."""

    def __init__(self, kind: str, key: object, known: list[str]) -> None:
        self.kind, self.key, self.known = kind, key, known
        super().__init__(f"unknown {kind} {key!r}; known: {', '.join(known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class MatchFieldInfo:
    """One key field of a table.

    `match_type` is 'exact', 'lpm', 'ternary', 'range' or 'optional'.
    """

    id: int
    name: str
    bitwidth: int
    match_type: str


@dataclass(frozen=True)
class ParamInfo:
    """One action parameter."""

    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True)
class ActionInfo:
    """An action and its parameters (in P4Info order)."""

    id: int
    name: str
    alias: str
    params: tuple[ParamInfo, ...]
    params_by_id: dict[int, ParamInfo] = field(repr=False, compare=False)
    params_by_name: dict[str, ParamInfo] = field(repr=False, compare=False)

    def param(self, key: str | int) -> ParamInfo:
        """Look a parameter up by name or id."""
        found = self.params_by_id.get(key) if isinstance(key, int) else self.params_by_name.get(key)
        if found is None:
            raise P4InfoLookupError(
                f"parameter of action {self.name}", key, list(self.params_by_name)
            )
        return found


@dataclass(frozen=True)
class TableInfo:
    """A table: key fields in P4Info order, allowed actions and their scopes, attached resources."""

    id: int
    name: str
    alias: str
    match_fields: tuple[MatchFieldInfo, ...]
    action_ids: tuple[int, ...]
    action_scopes: dict[int, str] = field(repr=False, compare=False)
    const_default_action_id: int = 0
    # (action id, ((param id, value bytes), ...)) from P4Info's initial_default_action, if any.
    initial_default_action: tuple[int, tuple[tuple[int, bytes], ...]] | None = None
    direct_counter_id: int = 0
    size: int = 0
    is_const: bool = False
    implementation_id: int = 0
    fields_by_id: dict[int, MatchFieldInfo] = field(default_factory=dict, repr=False, compare=False)
    fields_by_name: dict[str, MatchFieldInfo] = field(
        default_factory=dict, repr=False, compare=False
    )

    def match_field(self, key: str | int) -> MatchFieldInfo:
        """Look a key field up by name or id."""
        found = self.fields_by_id.get(key) if isinstance(key, int) else self.fields_by_name.get(key)
        if found is None:
            raise P4InfoLookupError(
                f"match field of table {self.name}", key, list(self.fields_by_name)
            )
        return found

    @property
    def needs_priority(self) -> bool:
        """True when entries need a priority (a ternary, range or optional field)."""
        return any(f.match_type in ("ternary", "range", "optional") for f in self.match_fields)


@dataclass(frozen=True)
class CounterInfo:
    """An indirect counter array (`size` cells) or, with `direct_table_id`, a direct counter."""

    id: int
    name: str
    alias: str
    unit: str
    size: int = 0
    direct_table_id: int = 0


@dataclass(frozen=True)
class RegisterInfo:
    """A register array (BMv2 cannot read or write it over P4Runtime)."""

    id: int
    name: str
    alias: str
    size: int
    bitwidth: int


T = TypeVar("T", TableInfo, ActionInfo, CounterInfo, RegisterInfo)


def _unique_suffixes(items: list[T]) -> dict[str, T]:
    """Each dotted suffix of a full name ("aggregation.job_table") that names one entity."""
    owners: dict[str, list[T]] = {}
    for item in items:
        parts = item.name.split(".")
        for i in range(1, len(parts)):
            owners.setdefault(".".join(parts[i:]), []).append(item)
    return {suffix: found[0] for suffix, found in owners.items() if len(found) == 1}


class _Entities(Generic[T]):
    """Entities of one kind, found by full name, alias or id."""

    def __init__(self, kind: str, items: list[T]) -> None:
        self.kind = kind
        self.by_id: dict[int, T] = {i.id: i for i in items}
        self.by_name: dict[str, T] = {i.name: i for i in items}
        self._by_alias: dict[str, T] = {i.alias: i for i in items if i.alias}
        self._by_suffix: dict[str, T] = _unique_suffixes(items)

    def get(self, key: str | int) -> T:
        if isinstance(key, int):
            found = self.by_id.get(key)
        else:
            found = self.by_name.get(key) or self._by_alias.get(key) or self._by_suffix.get(key)
        if found is None:
            raise P4InfoLookupError(self.kind, key, list(self.by_name))
        return found

    def __iter__(self) -> Iterator[T]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)


def _table(t: p4info_pb2.Table, direct_counters: dict[int, int]) -> TableInfo:
    fields = tuple(
        MatchFieldInfo(f.id, f.name, f.bitwidth, MATCH_TYPES.get(f.match_type, "unspecified"))
        for f in t.match_fields
    )
    initial = None
    if t.HasField("initial_default_action"):
        call = t.initial_default_action
        initial = (call.action_id, tuple((a.param_id, a.value) for a in call.arguments))
    counter_id = next((r for r in t.direct_resource_ids if r in direct_counters), 0)
    counter_id = counter_id or next(
        (c for c, tid in direct_counters.items() if tid == t.preamble.id), 0
    )
    return TableInfo(
        id=t.preamble.id,
        name=t.preamble.name,
        alias=t.preamble.alias,
        match_fields=fields,
        action_ids=tuple(a.id for a in t.action_refs),
        action_scopes={a.id: SCOPES.get(a.scope, "table_and_default") for a in t.action_refs},
        const_default_action_id=t.const_default_action_id,
        initial_default_action=initial,
        direct_counter_id=counter_id,
        size=t.size,
        is_const=t.is_const_table,
        implementation_id=t.implementation_id,
        fields_by_id={f.id: f for f in fields},
        fields_by_name={f.name: f for f in fields},
    )


def _action(a: p4info_pb2.Action) -> ActionInfo:
    params = tuple(ParamInfo(p.id, p.name, p.bitwidth) for p in a.params)
    return ActionInfo(
        a.preamble.id,
        a.preamble.name,
        a.preamble.alias,
        params,
        {p.id: p for p in params},
        {p.name: p for p in params},
    )


def _counter(
    c: p4info_pb2.Counter | p4info_pb2.DirectCounter, size: int = 0, direct_table_id: int = 0
) -> CounterInfo:
    """An indirect counter (its `size`) or a direct one (its table's id)."""
    unit = COUNTER_UNITS.get(c.spec.unit, "unspecified")
    return CounterInfo(
        c.preamble.id, c.preamble.name, c.preamble.alias, unit, size, direct_table_id
    )


def _register_bitwidth(r: p4info_pb2.Register) -> int:
    bits = r.type_spec.bitstring
    for kind in ("bit", "int", "varbit"):
        if bits.HasField(kind):
            sub = getattr(bits, kind)
            return sub.max_bitwidth if kind == "varbit" else sub.bitwidth
    return 0


class P4InfoIndex:
    """Name <-> id lookups over a P4Info, for the switch's state store and the controller."""

    def __init__(self, p4info: p4info_pb2.P4Info) -> None:
        self.proto = p4info
        direct = {c.preamble.id: c.direct_table_id for c in p4info.direct_counters}
        self.tables: _Entities[TableInfo] = _Entities(
            "table", [_table(t, direct) for t in p4info.tables]
        )
        self.actions: _Entities[ActionInfo] = _Entities(
            "action", [_action(a) for a in p4info.actions]
        )
        self.counters: _Entities[CounterInfo] = _Entities(
            "counter", [_counter(c, size=c.size) for c in p4info.counters]
        )
        self.direct_counters: _Entities[CounterInfo] = _Entities(
            "direct counter",
            [_counter(c, direct_table_id=c.direct_table_id) for c in p4info.direct_counters],
        )
        self.registers: _Entities[RegisterInfo] = _Entities(
            "register",
            [
                RegisterInfo(
                    r.preamble.id, r.preamble.name, r.preamble.alias, r.size, _register_bitwidth(r)
                )
                for r in p4info.registers
            ],
        )

    @classmethod
    def from_text(cls, text: str) -> P4InfoIndex:
        """Parse a text-format P4Info (what p4c's --p4runtime-files writes for .txt/.txtpb)."""
        return cls(text_format.Parse(text, p4info_pb2.P4Info()))

    @classmethod
    def from_text_file(cls, path: Path | str) -> P4InfoIndex:
        """Load a text-format P4Info file."""
        return cls.from_text(Path(path).read_text())

    @classmethod
    def from_bytes(cls, data: bytes) -> P4InfoIndex:
        """Parse a binary-serialized P4Info."""
        return cls(p4info_pb2.P4Info.FromString(data))

    def table(self, key: str | int) -> TableInfo:
        """A table by full name, alias or id."""
        return self.tables.get(key)

    def action(self, key: str | int) -> ActionInfo:
        """An action by full name, alias or id."""
        return self.actions.get(key)

    def counter(self, key: str | int) -> CounterInfo:
        """An indirect counter by full name, alias or id."""
        return self.counters.get(key)

    def direct_counter(self, key: str | int) -> CounterInfo:
        """A direct counter by full name, alias or id."""
        return self.direct_counters.get(key)

    def register(self, key: str | int) -> RegisterInfo:
        """A register by full name, alias or id."""
        return self.registers.get(key)

    def table_id(self, name: str) -> int:
        """The id of a table."""
        return self.tables.get(name).id

    def table_name(self, table_id: int) -> str:
        """The full name of a table."""
        return self.tables.get(table_id).name

    def action_id(self, name: str) -> int:
        """The id of an action."""
        return self.actions.get(name).id

    def action_name(self, action_id: int) -> str:
        """The full name of an action."""
        return self.actions.get(action_id).name

    def table_actions(self, table: str | int) -> list[ActionInfo]:
        """The actions a table allows, in P4Info order."""
        return [self.actions.get(a) for a in self.tables.get(table).action_ids]

    def table_direct_counter(self, table: str | int) -> CounterInfo | None:
        """The direct counter attached to a table, if any."""
        counter_id = self.tables.get(table).direct_counter_id
        return self.direct_counters.get(counter_id) if counter_id else None
