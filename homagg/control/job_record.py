"""The controller's view of jobs: what is persisted (ids, pools, ranks) and what only lives
while the controller runs (leases, whether the entries are on the switch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from homagg.control.aggregation import JobEntries, Worker
from homagg.control.delivery import mcast_grp_of_job


class JobState(StrEnum):
    """What a job is doing, as operators and workers see it."""

    WAITING = "waiting"  # some ranks have not joined
    # every rank joined; the entries are not (yet, or no longer known to be) on the switch
    INSTALLING = "installing"
    READY = "ready"  # installed: the data plane aggregates it
    ENDED = "ended"  # entries removed and pool freed (left, expired or released)


@dataclass
class JobWorker:
    """One joined rank: where its packets come from and where results go."""

    rank: int
    mac: str
    ip: str
    udp_port: int
    switch_port: int
    left: bool = False
    deadline: float = 0.0  # monotonic time its lease runs out (not persisted)
    # The switch it is attached to: its job's, or in a tree its leaf (not persisted: set at
    # the join, and at a restart from the topology)
    switch: str = ""

    def same_endpoint(self, other: JobWorker) -> bool:
        """True when both describe the same worker (a retried join)."""
        return (self.mac, self.ip, self.udp_port, self.switch_port) == (
            other.mac,
            other.ip,
            other.udp_port,
            other.switch_port,
        )


@dataclass(frozen=True)
class GaveUp:
    """A rank that gave up a call of the job's stream (its switch path failed, or it waited
    as long as it may): the others cannot complete that call without it, so the controller
    tells them in their heartbeat answers and they stop waiting at once (not persisted)."""

    rank: int
    chunk: int  # the stream index of the first chunk of the call it gave up
    reason: str  # for the others' fallback warnings (at most MAX_REASON characters)

    MAX_REASON: ClassVar[int] = 300

    def __str__(self) -> str:
        return f"rank {self.rank} gave up chunk {self.chunk}: {self.reason}"

    @classmethod
    def from_message(cls, msg: Any, rank: int | None = None) -> GaveUp:
        """From the protobuf GaveUp, with `rank` instead of its own when given (a request's is
        the requesting rank's); the reason cut to MAX_REASON printable characters."""
        reason = "".join(c if c.isprintable() else " " for c in msg.reason[: cls.MAX_REASON])
        return cls(msg.rank if rank is None else rank, msg.chunk, reason)


@dataclass
class Job:
    """A job and its ranks; `switch`/`pool_base` are None until the switch is chosen. A job
    spanning a tree runs on `switch`, the parent, with a pool on each of its `leaves` too."""

    job_id: int
    name: str
    token_hash: str
    world_size: int
    codec: str
    pool_size: int  # slots of the job's pool (allocated once `switch` is known)
    created: float
    switch: str | None = None
    pool_base: int | None = None
    ended: float | None = None
    end_reason: str = ""
    workers: dict[int, JobWorker] = field(default_factory=dict)
    # A tree job's leaves and their pool bases (empty: a flat job, on `switch` only)
    leaves: dict[str, int] = field(default_factory=dict)
    # The switches whose entries of the job were verified or written since they (re)connected
    installed_on: set[str] = field(default_factory=set)
    idle_deadline: float = 0.0  # monotonic; ends a job that no live rank holds
    gave_up: GaveUp | None = None  # the give-up of the newest call a rank told (not persisted)
    gave_ups: int = 0  # calls given up and told since the controller started (not persisted)

    @property
    def switches(self) -> tuple[str, ...]:
        """Every switch the job holds a pool on: its switch (a tree's parent), then leaves."""
        return () if self.switch is None else (self.switch, *self.leaves)

    @property
    def pools(self) -> dict[str, int]:
        """Each switch's pool base (every pool has `pool_size` slots)."""
        if self.switch is None or self.pool_base is None:
            return {}
        return {self.switch: self.pool_base, **self.leaves}

    @property
    def installed(self) -> bool:
        """Its entries are on every one of its switches: the data plane aggregates it."""
        return bool(self.switch) and set(self.switches) <= self.installed_on

    @property
    def complete(self) -> bool:
        """Every rank joined: the job's entries belong on its switch."""
        return len(self.workers) == self.world_size

    @property
    def state(self) -> JobState:
        """The state derived from the persisted facts and `installed`."""
        if self.ended is not None:
            return JobState.ENDED
        if self.installed:
            return JobState.READY
        return JobState.INSTALLING if self.complete else JobState.WAITING

    def tell(self, gave_up: GaveUp) -> bool:
        """Record a rank's give-up if its call is newer than the one recorded (a give-up of
        an older call is of an earlier alignment of the ranks' streams); True if so."""
        if self.gave_up is not None and gave_up.chunk <= self.gave_up.chunk:
            return False
        self.gave_up = gave_up
        self.gave_ups += 1
        return True

    def live_ranks(self) -> list[JobWorker]:
        """Joined ranks that have not left: each holds a lease."""
        return [w for w in self.workers.values() if not w.left]

    def entries(self) -> JobEntries:
        """The data-plane view of a flat job (only complete, with a pool; a tree job's:
        homagg/control/tree.py)."""
        if self.pool_base is None or not self.complete or self.leaves:
            raise ValueError(f"job {self.job_id} has no pool or missing ranks")
        workers = tuple(
            Worker(rank=w.rank, switch_port=w.switch_port, mac=w.mac, ip=w.ip, udp_port=w.udp_port)
            for w in sorted(self.workers.values(), key=lambda w: w.rank)
        )
        return JobEntries(
            job_id=self.job_id,
            pool_base=self.pool_base,
            pool_size=self.pool_size,
            mcast_grp=mcast_grp_of_job(self.job_id),
            workers=workers,
        )
