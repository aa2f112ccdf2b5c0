"""Entries of the Aggregation control (p4src/aggregation.p4): a job as the data plane sees
it on one switch (its pool of slots, multicast group, members and, at a leaf of a tree, its
uplink), its job_table entry, the worker_table entry of each member and the uplink entry."""

from __future__ import annotations

from dataclasses import dataclass

from homagg.control.entries import EntrySpec
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.wire import p4names
from homagg.wire.constants import MAX_JOB_ID, MAX_RANKS, MAX_WORKERS_PER_JOB, NUM_SLOTS

MAX_MCAST_GRP = (1 << 16) - 1  # v1model's mcast_grp is bit<16>; 0 means no group


@dataclass(frozen=True)
class Worker:
    """One rank of a job: the switch port it is attached to and where its results go."""

    rank: int
    switch_port: int
    mac: str
    ip: str
    udp_port: int


@dataclass(frozen=True)
class Uplink:
    """A leaf's way up for a job of a tree: its port toward the parent, its rank among the
    parent's members (the uplink rank) and the parent's service address."""

    port: int
    rank: int
    parent_ip: str
    parent_mac: str


@dataclass(frozen=True)
class JobEntries:
    """A job as the data plane of one switch sees it: its pool of slots, group and members
    (a flat job's or a leaf's workers; a parent's members are its leaves), and at a leaf its
    uplink. A member's bit in the seen bitmap is 1 << its index in rank order."""

    job_id: int
    pool_base: int
    pool_size: int
    mcast_grp: int
    workers: tuple[Worker, ...]
    uplink: Uplink | None = None

    def validate(self) -> None:
        """Raise ValueError for a job the program cannot serve."""
        if not 1 <= self.job_id <= MAX_JOB_ID:
            raise ValueError(f"job id {self.job_id} outside 1..{MAX_JOB_ID}")
        if not 1 <= len(self.workers) <= MAX_WORKERS_PER_JOB:
            raise ValueError(f"{len(self.workers)} workers: a job has 1..{MAX_WORKERS_PER_JOB}")
        ranks = [w.rank for w in self.workers]
        if self.uplink is None and ranks != list(range(len(self.workers))):
            raise ValueError("worker ranks must be 0..world_size-1, each once, in order")
        if ranks != sorted(set(ranks)) or not 0 <= ranks[0] <= ranks[-1] < MAX_RANKS:
            raise ValueError(f"worker ranks must be distinct, in order, in 0..{MAX_RANKS - 1}")
        if self.uplink is not None and not 0 <= self.uplink.rank < MAX_WORKERS_PER_JOB:
            raise ValueError(f"uplink rank {self.uplink.rank} outside 0..{MAX_WORKERS_PER_JOB - 1}")
        if self.pool_size < 1 or self.pool_base + self.pool_size > NUM_SLOTS:
            raise ValueError(
                f"pool {self.pool_base}+{self.pool_size} outside the switch's {NUM_SLOTS} slots"
            )
        if not 1 <= self.mcast_grp <= MAX_MCAST_GRP:
            raise ValueError(f"multicast group {self.mcast_grp} outside 1..{MAX_MCAST_GRP}")


def worker_key(job: JobEntries, worker: Worker) -> dict[str, int]:
    """The key of a rank's entries (worker_table here, result_rewrite in delivery.p4)."""
    return {"hdr.agg.job_id": job.job_id, "hdr.agg.rank": worker.rank}


def worker_entries(job: JobEntries) -> list[EntrySpec]:
    """Per member: the port its packets must arrive on and its bit in the slot's seen bitmap
    (1 << its index: its rank in a flat job, its index among a leaf's workers in a tree)."""
    return [
        EntrySpec.of(
            p4names.WORKER_TABLE,
            worker_key(job, w),
            p4names.SET_WORKER,
            {"port": w.switch_port, "worker_bit": 1 << index},
        )
        for index, w in enumerate(job.workers)
    ]


def uplink_entries(job: JobEntries) -> list[EntrySpec]:
    """A leaf's uplink entry (none elsewhere): a slot copy that completes sends its partial
    sum to the parent instead of multicasting it. Written before the leaf's job entry."""
    up = job.uplink
    if up is None:
        return []
    return [uplink_entry(job.job_id, up.port, up.rank, up.parent_ip, up.parent_mac)]


def job_entry(job: JobEntries) -> EntrySpec:
    """The job_table entry: the job's pool, world size and multicast group. Until it exists
    the switch drops the job's packets (UNKNOWN_JOB)."""
    return EntrySpec.of(
        p4names.JOB_TABLE,
        {"hdr.agg.job_id": job.job_id},
        p4names.SET_JOB,
        {
            "pool_base": job.pool_base,
            "pool_size": job.pool_size,
            "num_workers": len(job.workers),
            "mcast_grp": job.mcast_grp,
        },
    )


def uplink_entry(job_id: int, port: int, rank: int, parent_ip: str, parent_mac: str) -> EntrySpec:
    """The uplink entry that makes a switch a leaf of a two-level job: its completed slot
    copies go out of `port` to the parent's service address as uplink rank `rank`, and it
    takes the parent's results from that port (docs/protocol.md, Two-level aggregation).
    Written before the leaf's job entry, removed after it."""
    return EntrySpec.of(
        p4names.UPLINK,
        {"hdr.agg.job_id": job_id},
        p4names.SET_UPLINK,
        {
            "port": port,
            "rank": rank,
            "parent_ip": ipv4_to_int(parent_ip),
            "parent_mac": mac_to_int(parent_mac),
        },
    )
