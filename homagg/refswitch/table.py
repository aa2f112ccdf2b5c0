"""One match-action table of the reference switch: entries, default action, direct counters.

Entries are kept as decoded ints so the per-packet lookup never touches protobuf.
A key field's match is always a pair of ints, whatever its kind:

    exact    (value, all-ones mask)       lpm       (value, prefix_len)
    ternary  (value, mask)                range     (low, high)
    optional (value, all-ones) or (0, 0) for a wildcard

An omitted (don't care) field is (0, 0) for lpm, ternary and optional, and
(0, 2**bitwidth - 1) for range. An entry is identified by (match, priority).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Mapping

from google.rpc import code_pb2

from homagg.p4rt.entities import MatchValue
from homagg.p4rt.p4info import ActionInfo, P4InfoIndex, TableInfo

FieldMatch = tuple[int, int]


class DeviceError(Exception):
    """A refused state change, with the google.rpc canonical code P4Runtime reports for it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Entry:
    """A table entry (or a table's default entry): decoded match, action and direct counter."""

    __slots__ = (
        "action",
        "action_name",
        "bytes",
        "controller_metadata",
        "idle_timeout_ns",
        "masked",
        "match",
        "metadata",
        "packets",
        "params",
        "priority",
        "ranges",
        "seq",
    )

    def __init__(
        self,
        match: tuple[FieldMatch, ...],
        priority: int,
        action: ActionInfo,
        params: dict[str, int],
        seq: int = 0,
    ) -> None:
        self.match = match
        self.priority = priority
        self.seq = seq
        self.packets = 0
        self.bytes = 0
        self.controller_metadata = 0
        self.metadata = b""
        self.idle_timeout_ns = 0
        self.masked: tuple[
            tuple[int, int, int], ...
        ] = ()  # (field index, mask, value), set by Table
        self.ranges: tuple[tuple[int, int, int], ...] = ()  # (field index, low, high)
        self.set_action(action, params)

    def set_action(self, action: ActionInfo, params: dict[str, int]) -> None:
        """Replace the action (and its parameters) of this entry."""
        self.action = action
        self.action_name = action.name
        self.params = dict(params)

    @property
    def key(self) -> tuple[tuple[FieldMatch, ...], int]:
        """The identity of the entry in its table."""
        return self.match, self.priority


class Table:
    """A table's entries with a lookup structure chosen from its match kinds.

    exact only -> one dict (O(1)); one lpm field plus exact ones -> one dict per prefix
    length, longest first; any ternary, range or optional field -> entries in priority
    order (higher P4Runtime priority first, then insertion order). Mutations are made by
    the P4Runtime server under Device.lock; lookups read structures replaced rather than
    mutated where they iterate, so a lookup racing a write sees either state.
    """

    def __init__(self, info: TableInfo, p4info: P4InfoIndex) -> None:
        self.info = info
        self.name = info.name
        self.alias = info.alias or info.name
        self.p4info = p4info
        self.has_counter = bool(info.direct_counter_id)
        kinds = [f.match_type for f in info.match_fields]
        self._full = [(1 << f.bitwidth) - 1 for f in info.match_fields]
        self._kinds = kinds
        if any(k in ("ternary", "range", "optional") for k in kinds):
            self.kind = "priority"
        elif "lpm" in kinds:
            self.kind = "lpm"
        else:
            self.kind = "exact"
        self._lpm_field = kinds.index("lpm") if self.kind == "lpm" else -1
        self._entries: dict[tuple[tuple[FieldMatch, ...], int], Entry] = {}
        self._exact: dict[tuple[int, ...], Entry] = {}
        self._lpm: dict[int, dict[tuple[int, ...], Entry]] = {}
        self._lpm_levels: tuple[tuple[int, int, dict[tuple[int, ...], Entry]], ...] = ()
        self._ordered: list[Entry] = []
        self._seq = itertools.count()
        self._initial: tuple[ActionInfo, dict[str, int]] = self._fallback_default()
        self.default = Entry((), 0, *self._initial)

    # -- lookup (per packet) --------------------------------------------------------

    def lookup(self, key: tuple[int, ...], nbytes: int) -> tuple[bool, str, dict[str, int]]:
        """Match `key` (one int per field, P4Info order) -> (hit, action full name, params by name).

        On a miss: (False, default action's full name, its params). On a hit the entry's
        direct counter (if any) counts 1 packet of `nbytes` bytes. The params dict is the
        entry's own: read it, never modify it. Call with Device.lock held.
        """
        entry = self._match(key)
        if entry is None:
            d = self.default
            return False, d.action_name, d.params
        if self.has_counter:
            entry.packets += 1
            entry.bytes += nbytes
        return True, entry.action_name, entry.params

    def _match(self, key: tuple[int, ...]) -> Entry | None:
        if self.kind == "exact":
            return self._exact.get(key)
        if self.kind == "lpm":
            i = self._lpm_field
            for _plen, mask, bucket in self._lpm_levels:
                entry = bucket.get((*key[:i], key[i] & mask, *key[i + 1 :]))
                if entry is not None:
                    return entry
            return None
        for entry in self._ordered:
            for i, mask, value in entry.masked:
                if key[i] & mask != value:
                    break
            else:
                for i, low, high in entry.ranges:
                    if not low <= key[i] <= high:
                        break
                else:
                    return entry
        return None

    # -- control plane ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> Iterator[Entry]:
        """The entries in insertion order (the default entry excluded)."""
        return iter(list(self._entries.values()))

    def get(self, match: tuple[FieldMatch, ...], priority: int = 0) -> Entry | None:
        """The entry with this match and priority, if present."""
        return self._entries.get((match, priority))

    def dont_care(self, index: int) -> FieldMatch:
        """The match of an omitted field `index` (see the module docstring)."""
        return (0, self._full[index]) if self._kinds[index] == "range" else (0, 0)

    def match_of(self, named: Mapping[str, MatchValue | None]) -> tuple[FieldMatch, ...]:
        """The stored form of a key by field name (an entity's match), don't cares filled in."""
        out: list[FieldMatch] = []
        for i, (field, full) in enumerate(zip(self.info.match_fields, self._full)):
            value = named.get(field.name)
            if value is None:
                out.append(self.dont_care(i))
            elif isinstance(value, int):  # exact or optional
                out.append((value, full))
            else:
                out.append(value)
        return tuple(out)

    def named_match(self, match: tuple[FieldMatch, ...]) -> dict[str, MatchValue]:
        """A stored key by field name, don't cares left out (the inverse of match_of)."""
        named: dict[str, MatchValue] = {}
        for i, (field, kind, pair) in enumerate(zip(self.info.match_fields, self._kinds, match)):
            if pair != self.dont_care(i):
                named[field.name] = pair[0] if kind in ("exact", "optional") else pair
        return named

    def insert(
        self,
        match: tuple[FieldMatch, ...],
        action: ActionInfo,
        params: dict[str, int],
        priority: int = 0,
    ) -> Entry:
        """Add an entry; ALREADY_EXISTS if present, RESOURCE_EXHAUSTED when the table is full."""
        self.check_match(match, priority)
        self.check_action(action, params, default=False)
        if (match, priority) in self._entries:
            raise DeviceError(
                code_pb2.ALREADY_EXISTS,
                "Match entry exists, use MODIFY if you wish to change action",
            )
        if self.info.size and len(self._entries) >= self.info.size:
            raise DeviceError(
                code_pb2.RESOURCE_EXHAUSTED, f"Table {self.name} is full ({self.info.size} entries)"
            )
        entry = Entry(match, priority, action, params, next(self._seq))
        self._index(entry)
        self._entries[entry.key] = entry
        return entry

    def modify(
        self,
        match: tuple[FieldMatch, ...],
        action: ActionInfo,
        params: dict[str, int],
        priority: int = 0,
    ) -> Entry:
        """Change an entry's action; NOT_FOUND if absent. Its direct counter is kept."""
        self.check_match(match, priority)
        self.check_action(action, params, default=False)
        entry = self._entries.get((match, priority))
        if entry is None:
            raise DeviceError(code_pb2.NOT_FOUND, "Cannot find match entry")
        entry.set_action(action, params)
        return entry

    def delete(self, match: tuple[FieldMatch, ...], priority: int = 0) -> None:
        """Remove an entry; NOT_FOUND if absent."""
        self.check_match(match, priority)
        entry = self._entries.pop((match, priority), None)
        if entry is None:
            raise DeviceError(code_pb2.NOT_FOUND, "Cannot find match entry")
        self._unindex(entry)

    def set_default(self, action: ActionInfo, params: dict[str, int]) -> None:
        """Set the miss action; PERMISSION_DENIED for a table with a const default action."""
        self.check_default_writable()
        self.check_action(action, params, default=True)
        self.default.set_action(action, params)

    def reset_default(self) -> None:
        """Restore the initial default action (a P4Runtime default MODIFY without an action)."""
        self.check_default_writable()
        self.default.set_action(*self._initial)

    def set_initial_default(self, action: ActionInfo, params: dict[str, int]) -> None:
        """Declare the program's initial default action (from BMv2 JSON) and apply it now."""
        self._initial = (action, dict(params))
        self.default.set_action(action, params)

    def clear(self) -> None:
        """Remove every entry and restore the initial default action."""
        self._entries.clear()
        self._exact.clear()
        self._lpm.clear()
        self._lpm_levels = ()
        self._ordered = []
        self.default.set_action(*self._initial)
        self.default.packets = self.default.bytes = 0

    def check_match(self, match: tuple[FieldMatch, ...], priority: int) -> None:
        """INVALID_ARGUMENT unless `match` is well formed for this table (PI's checks, messages)."""
        if len(match) != len(self._kinds):
            raise DeviceError(
                code_pb2.INVALID_ARGUMENT,
                f"Match key of table {self.name} needs {len(self._kinds)} fields, got {len(match)}",
            )
        for kind, full, field, (a, b) in zip(
            self._kinds, self._full, self.info.match_fields, match
        ):
            width = field.bitwidth
            if a < 0 or b < 0 or a > full or (kind != "lpm" and b > full):
                raise DeviceError(
                    code_pb2.INVALID_ARGUMENT,
                    f"Bytestring provided does not fit within {width} bits ({field.name})",
                )
            if kind == "exact" and b != full:
                raise DeviceError(
                    code_pb2.INVALID_ARGUMENT, f"Exact field {field.name} needs a full mask"
                )
            elif kind == "lpm":
                if b > width:
                    raise DeviceError(
                        code_pb2.INVALID_ARGUMENT, "Prefix length cannot be > bitwidth"
                    )
                if a & ((1 << (width - b)) - 1):
                    raise DeviceError(
                        code_pb2.INVALID_ARGUMENT,
                        "Invalid LPM value, incorrect number of trailing zeros",
                    )
            elif kind == "ternary" and a & b != a:
                raise DeviceError(
                    code_pb2.INVALID_ARGUMENT,
                    "Invalid ternary value, make sure value & mask == value",
                )
            elif kind == "range" and a > b:
                raise DeviceError(
                    code_pb2.INVALID_ARGUMENT, "Invalid range value, make sure low <= high"
                )
            elif kind == "optional" and (b not in (0, full) or a & b != a):
                raise DeviceError(
                    code_pb2.INVALID_ARGUMENT, f"Invalid optional match on {field.name}"
                )
        if priority < 0:
            raise DeviceError(code_pb2.INVALID_ARGUMENT, "Priority must be >= 0")
        if self.info.needs_priority and priority == 0:
            raise DeviceError(code_pb2.INVALID_ARGUMENT, "Zero priority for ternary match")
        if not self.info.needs_priority and priority > 0:
            raise DeviceError(code_pb2.INVALID_ARGUMENT, "Non-zero priority for non-ternary match")

    def check_action(self, action: ActionInfo, params: dict[str, int], *, default: bool) -> None:
        """INVALID_ARGUMENT unless `action` is allowed here with exactly its params, in range."""
        scope = self.info.action_scopes.get(action.id)
        if scope is None:
            raise DeviceError(
                code_pb2.INVALID_ARGUMENT,
                f"Invalid action for table: {action.name} is not an action of {self.name}",
            )
        if scope == "table_only" and default:
            raise DeviceError(
                code_pb2.PERMISSION_DENIED, "Cannot use TABLE_ONLY action as default action"
            )
        if scope == "default_only" and not default:
            raise DeviceError(
                code_pb2.PERMISSION_DENIED, "Cannot use DEFAULT_ONLY action in table entry"
            )
        if set(params) != set(action.params_by_name):
            raise DeviceError(
                code_pb2.INVALID_ARGUMENT,
                f"Unexpected action parameters for {action.name}: got {sorted(params)}, "
                f"expected {[p.name for p in action.params]}",
            )
        for p in action.params:
            if not 0 <= params[p.name] < 1 << p.bitwidth:
                raise DeviceError(
                    code_pb2.INVALID_ARGUMENT,
                    f"Value of parameter {p.name} does not fit within {p.bitwidth} bits",
                )

    def check_default_writable(self) -> None:
        """PERMISSION_DENIED if the table's default action is const."""
        if self.info.const_default_action_id:
            raise DeviceError(
                code_pb2.PERMISSION_DENIED,
                f"Cannot set / reset default action for table {self.info.id} "
                "which has a const default action",
            )

    def _fallback_default(self) -> tuple[ActionInfo, dict[str, int]]:
        """The default action known from the P4Info alone (BMv2 JSON may refine it later).

        initial_default_action if present; else the const default action (its parameters,
        which P4Info does not carry, read as 0); else NoAction if the table has it; else an
        empty action named "" (the pipeline does nothing on a miss).
        """
        info, p4 = self.info, self.p4info
        if info.initial_default_action is not None:
            action = p4.action(info.initial_default_action[0])
            args = dict(info.initial_default_action[1])
            return action, {
                p.name: int.from_bytes(args.get(p.id, b""), "big") for p in action.params
            }
        if info.const_default_action_id:
            action = p4.action(info.const_default_action_id)
            return action, {p.name: 0 for p in action.params}
        for action_id in info.action_ids:
            if p4.action(action_id).name == "NoAction":
                return p4.action(action_id), {}
        return ActionInfo(0, "", "", (), {}, {}), {}

    # -- index maintenance ----------------------------------------------------------

    def _index(self, entry: Entry) -> None:
        if self.kind == "exact":
            self._exact[tuple(v for v, _ in entry.match)] = entry
        elif self.kind == "lpm":
            plen = entry.match[self._lpm_field][1]
            bucket = self._lpm.get(plen)
            if bucket is None:
                bucket = self._lpm[plen] = {}
                self._rebuild_levels()
            bucket[self._lpm_key(entry)] = entry
        else:
            masked, ranges = [], []
            for i, (kind, (a, b)) in enumerate(zip(self._kinds, entry.match)):
                if kind == "range":
                    if (a, b) != (0, self._full[i]):
                        ranges.append((i, a, b))
                elif b:
                    masked.append((i, self._full[i] if kind == "exact" else b, a))
            entry.masked, entry.ranges = tuple(masked), tuple(ranges)
            ordered = list(self._ordered)
            bisect.insort(ordered, entry, key=lambda e: (-e.priority, e.seq))
            self._ordered = ordered

    def _unindex(self, entry: Entry) -> None:
        if self.kind == "exact":
            del self._exact[tuple(v for v, _ in entry.match)]
        elif self.kind == "lpm":
            plen = entry.match[self._lpm_field][1]
            bucket = self._lpm[plen]
            del bucket[self._lpm_key(entry)]
            if not bucket:
                del self._lpm[plen]
                self._rebuild_levels()
        else:
            self._ordered = [e for e in self._ordered if e is not entry]

    def _lpm_key(self, entry: Entry) -> tuple[int, ...]:
        return tuple(v for v, _ in entry.match)

    def _rebuild_levels(self) -> None:
        width = self.info.match_fields[self._lpm_field].bitwidth
        full = (1 << width) - 1
        self._lpm_levels = tuple(
            (plen, full ^ ((1 << (width - plen)) - 1), self._lpm[plen])
            for plen in sorted(self._lpm, reverse=True)
        )
