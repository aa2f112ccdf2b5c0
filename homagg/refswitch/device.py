"""The forwarding state of one reference switch, written over P4Runtime, read by the pipeline.

Threads: the P4Runtime server mutates the state under `Device.lock`; the packet thread
should hold the same lock while it processes a packet so it sees one consistent state.
Everything is keyed by P4Info names (full names; aliases are accepted too).

Action names: Table.lookup() returns the action's full P4Info name (preamble.name,
e.g. "SwitchIngress.forwarding.route"), as homagg.wire.p4names spells them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from homagg.p4rt.api import p4info_pb2
from homagg.p4rt.p4info import CounterInfo, P4InfoIndex, P4InfoLookupError
from homagg.refswitch.table import DeviceError, Entry, Table

__all__ = ["Counter", "Device", "DeviceError", "Entry", "Table"]

log = logging.getLogger(__name__)


class Counter:
    """An indirect counter array: per-cell packet and byte counts.

    BMv2 keeps both, whatever the counter's unit.
    """

    def __init__(self, info: CounterInfo) -> None:
        self.info = info
        self.name = info.name
        self.size = info.size
        self.packets = [0] * info.size
        self.bytes = [0] * info.size

    def count(self, index: int, nbytes: int) -> None:
        """Count one packet of `nbytes` bytes at `index`.

        An index out of range is ignored, as BMv2 does (it logs "Attempted to update
        counter ... at out-of-bounds index" and updates nothing).
        """
        if 0 <= index < self.size:
            self.packets[index] += 1
            self.bytes[index] += nbytes

    def add(self, index: int, packets: int, nbytes: int = 0) -> None:
        """Count `packets` packets (of `nbytes` bytes in all) at `index` at once (frames the
        switch counted outside the pipeline); out of range ignored, as count()."""
        if 0 <= index < self.size:
            self.packets[index] += packets
            self.bytes[index] += nbytes

    def read(self, index: int) -> tuple[int, int]:
        """(packets, bytes) of one cell; IndexError out of range."""
        self._check(index)
        return self.packets[index], self.bytes[index]

    def write(self, index: int, packets: int, nbytes: int) -> None:
        """Set one cell (a P4Runtime CounterEntry MODIFY); IndexError out of range."""
        self._check(index)
        self.packets[index] = packets
        self.bytes[index] = nbytes

    def reset(self) -> None:
        """Zero every cell."""
        self.packets = [0] * self.size
        self.bytes = [0] * self.size

    def _check(self, index: int) -> None:
        if not 0 <= index < self.size:
            raise IndexError(
                f"index {index} out of range for counter {self.name} of size {self.size}"
            )


class Device:
    """Tables, counter arrays and multicast groups of one switch, replaced by each pipeline push."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.p4info: P4InfoIndex | None = None
        self.p4info_proto: p4info_pb2.P4Info | None = None
        self.device_config = b""
        self.cookie: int | None = None  # ForwardingPipelineConfig.cookie of the last push
        # Bumped on every load_pipeline, so a pipeline caching Table objects can notice a reload.
        self.config_generation = 0
        self.multicast_groups: dict[int, list[tuple[int, int]]] = {}
        # How each replica's port was written (0: the uint32 egress_port, n: `port` bytes of
        # length n), so a P4Runtime read returns it the same way, as PI does.
        self.multicast_port_widths: dict[int, dict[tuple[int, int], int]] = {}
        self._tables: dict[int, Table] = {}
        self._counters: dict[int, Counter] = {}
        self._tables_by_name: dict[
            str, Table
        ] = {}  # full names and aliases: one dict read per packet
        self._counters_by_name: dict[str, Counter] = {}

    def load_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes) -> None:
        """Install a new P4Info and reset ALL state (tables, counters, multicast groups).

        Tables start with their initial default action: from the BMv2 JSON in
        `device_config` when it has one, else from the P4Info (see Table._fallback_default).
        """
        index = P4InfoIndex(p4info)
        tables = {t.id: Table(t, index) for t in index.tables}
        _apply_bmv2_defaults(index, tables, device_config)
        with self.lock:
            self.p4info = index
            self.p4info_proto = p4info
            self.device_config = device_config
            self._tables = tables
            self._counters = {c.id: Counter(c) for c in index.counters}
            self._tables_by_name = _by_name(tables.values())
            self._counters_by_name = _by_name(self._counters.values())
            self.multicast_groups = {}
            self.multicast_port_widths = {}
            self.config_generation += 1

    def table(self, name: str) -> Table:
        """A table by full name or alias.

        Raises P4InfoLookupError (a KeyError) when unknown or before any pipeline.
        """
        try:
            return self._tables_by_name[name]
        except KeyError:
            raise P4InfoLookupError(
                "table", name, [t.name for t in self._tables.values()]
            ) from None

    def table_by_id(self, table_id: int) -> Table:
        """A table by P4Info id."""
        return self._tables[self._index().table(table_id).id]

    def tables(self) -> list[Table]:
        """Every table, in P4Info order."""
        return list(self._tables.values())

    def counter(self, name: str) -> Counter:
        """An indirect counter array by full name or alias (P4InfoLookupError when unknown)."""
        try:
            return self._counters_by_name[name]
        except KeyError:
            raise P4InfoLookupError(
                "counter", name, [c.name for c in self._counters.values()]
            ) from None

    def counter_by_id(self, counter_id: int) -> Counter:
        """An indirect counter array by P4Info id."""
        return self._counters[self._index().counter(counter_id).id]

    def counters(self) -> list[Counter]:
        """Every indirect counter array, in P4Info order."""
        return list(self._counters.values())

    def _index(self) -> P4InfoIndex:
        if self.p4info is None:
            raise P4InfoLookupError("pipeline", "(none)", [])
        return self.p4info


def _by_name(items: Iterable[Table | Counter]) -> dict[str, Any]:
    """Each item under its alias and its full name (the full name wins a clash)."""
    out: dict[str, Any] = {item.info.alias: item for item in items if item.info.alias}
    out.update((item.info.name, item) for item in items)
    return out


def _apply_bmv2_defaults(
    index: P4InfoIndex, tables: dict[int, Table], device_config: bytes
) -> None:
    """Set each table's initial default action from a BMv2 JSON's "default_entry", if any.

    P4Info carries no default action for a non-const `default_action = a(...)`: only the
    BMv2 JSON does. Anything that is not such a JSON is skipped silently.
    """
    try:
        program = json.loads(device_config)
    except (ValueError, UnicodeDecodeError):
        return
    if not isinstance(program, dict):
        return
    action_names = {
        a["id"]: str(a["name"])
        for a in program.get("actions", [])
        if isinstance(a, dict) and "id" in a and "name" in a
    }
    for pipeline in program.get("pipelines", []):
        for t in pipeline.get("tables", []):
            entry = t.get("default_entry")
            if not entry:
                continue
            try:
                table = tables[index.table(t["name"]).id]
                action = index.action(action_names[entry["action_id"]])
                values = [int(v, 16) for v in entry.get("action_data", [])]
            except (KeyError, ValueError, TypeError):
                log.debug("BMv2 JSON default entry of %s not applied", t.get("name"))
                continue
            if len(values) != len(action.params) or action.id not in table.info.action_scopes:
                continue
            table.set_initial_default(
                action, {p.name: v for p, v in zip(action.params, values, strict=True)}
            )
