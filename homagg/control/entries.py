"""Table entries and multicast groups as values: what the controller wants on a switch,
comparable with what it reads back, so that recovery installs exactly the difference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from homagg.control.write_batch import WriteBatch
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.entities import MatchValue, MulticastGroupEntry, TableEntry

Update = p4runtime_pb2.Update
# The kind of every GroupSpec, beside the table names that are the kinds of EntrySpecs.
MULTICAST_GROUPS = "multicast groups"


@dataclass(frozen=True)
class EntrySpec:
    """One table entry by full P4Info names; hashable, ordered fields."""

    table: str
    match: tuple[tuple[str, MatchValue], ...]
    action: str
    params: tuple[tuple[str, int], ...]

    @classmethod
    def of(
        cls, table: str, match: Mapping[str, MatchValue], action: str, params: Mapping[str, int]
    ) -> EntrySpec:
        """Build from dicts (the form SwitchConnection takes)."""
        return cls(table, tuple(sorted(match.items())), action, tuple(sorted(params.items())))

    @classmethod
    def read(cls, entry: TableEntry) -> EntrySpec:
        """The spec of an entry read back from a switch."""
        match = {name: value for name, value in entry.match.items() if value is not None}
        return cls.of(entry.table, match, entry.action, entry.params)

    @property
    def entry(self) -> TableEntry:
        """The entity to write."""
        return TableEntry(self.table, dict(self.match), self.action, dict(self.params))

    @property
    def kind(self) -> str:
        """Where it lives on the switch: its table."""
        return self.table

    @property
    def key(self) -> tuple[str, tuple[tuple[str, MatchValue], ...]]:
        """What identifies the entry in its table."""
        return self.table, self.match

    def insert(self, batch: WriteBatch) -> WriteBatch:
        """Add an INSERT of this entry to a batch."""
        return batch.write(Update.INSERT, self.entry)

    def modify(self, batch: WriteBatch) -> WriteBatch:
        """Add a MODIFY (same key, this action) to a batch."""
        return batch.write(Update.MODIFY, self.entry)

    def delete(self, batch: WriteBatch) -> WriteBatch:
        """Add a DELETE of this entry's key to a batch."""
        return batch.write(Update.DELETE, TableEntry(self.table, dict(self.match)))


@dataclass(frozen=True)
class GroupSpec:
    """One multicast group of the packet replication engine: id and (port, instance) replicas."""

    group_id: int
    replicas: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, group_id: int, replicas: Sequence[tuple[int, int]]) -> GroupSpec:
        """Build with the replicas in canonical (sorted) order, as compared with a read-back."""
        return cls(group_id, tuple(sorted(replicas)))

    @property
    def entry(self) -> MulticastGroupEntry:
        """The entity to write."""
        return MulticastGroupEntry(self.group_id, self.replicas)

    @property
    def kind(self) -> str:
        """Where it lives on the switch: the multicast groups."""
        return MULTICAST_GROUPS

    @property
    def key(self) -> tuple[str, int]:
        """What identifies the group."""
        return MULTICAST_GROUPS, self.group_id

    def insert(self, batch: WriteBatch) -> WriteBatch:
        """Add an INSERT of this group to a batch."""
        return batch.write(Update.INSERT, self.entry)

    def modify(self, batch: WriteBatch) -> WriteBatch:
        """Add a MODIFY (same id, these replicas) to a batch."""
        return batch.write(Update.MODIFY, self.entry)

    def delete(self, batch: WriteBatch) -> WriteBatch:
        """Add a DELETE of this group to a batch."""
        return batch.write(Update.DELETE, MulticastGroupEntry(self.group_id))


Spec = EntrySpec | GroupSpec
