"""The updates of one WriteRequest, built from the entity values of homagg.p4rt.entities.

Match values and don't-care fields: see homagg.p4rt.entities.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from homagg.p4rt import entities
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.entities import (
    CounterData,
    CounterEntry,
    DirectCounterEntry,
    MatchValue,
    MulticastGroupEntry,
    TableEntry,
)
from homagg.p4rt.p4info import P4InfoIndex

Update = p4runtime_pb2.Update


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

    def write(self, kind: int, value: entities.Entity) -> WriteBatch:
        """Append an Update of type `kind` (Update.INSERT, MODIFY or DELETE) of an entity."""
        return self.add(entities.update(kind, value, self.p4info))

    def insert_entry(
        self,
        table: str,
        match: Mapping[str, MatchValue | None],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
    ) -> WriteBatch:
        """INSERT a table entry."""
        return self.write(Update.INSERT, TableEntry(table, match, action, params or {}, priority))

    def modify_entry(
        self,
        table: str,
        match: Mapping[str, MatchValue | None],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
    ) -> WriteBatch:
        """MODIFY the action of a table entry."""
        return self.write(Update.MODIFY, TableEntry(table, match, action, params or {}, priority))

    def delete_entry(
        self, table: str, match: Mapping[str, MatchValue | None], priority: int = 0
    ) -> WriteBatch:
        """DELETE a table entry."""
        return self.write(Update.DELETE, TableEntry(table, match, priority=priority))

    def set_default_action(
        self, table: str, action: str, params: Mapping[str, int] | None = None
    ) -> WriteBatch:
        """MODIFY the default entry (the action taken on a miss)."""
        entry = TableEntry(table, action=action, params=params or {}, is_default=True)
        return self.write(Update.MODIFY, entry)

    def reset_default_action(self, table: str) -> WriteBatch:
        """Restore the program's initial default action (default MODIFY without action)."""
        return self.write(Update.MODIFY, TableEntry(table, is_default=True))

    def multicast_group(
        self, kind: int, group_id: int, replicas: Sequence[tuple[int, int]] = ()
    ) -> WriteBatch:
        """INSERT, MODIFY or DELETE (Update.*) a multicast group of (port, instance) replicas."""
        return self.write(kind, MulticastGroupEntry(group_id, tuple(replicas)))

    def write_counter(self, name: str, index: int, packets: int = 0, nbytes: int = 0) -> WriteBatch:
        """Set one cell of an indirect counter (MODIFY; 0, 0 resets it)."""
        return self.write(Update.MODIFY, CounterEntry(name, index, CounterData(packets, nbytes)))

    def write_direct_counter(
        self,
        table: str,
        match: Mapping[str, MatchValue | None],
        packets: int = 0,
        nbytes: int = 0,
        priority: int = 0,
    ) -> WriteBatch:
        """Set the direct counter of one entry (MODIFY; 0, 0 resets it)."""
        entry = TableEntry(table, match, priority=priority)
        return self.write(Update.MODIFY, DirectCounterEntry(entry, CounterData(packets, nbytes)))
