"""Entries of the Aggregation control (p4src/aggregation.p4) and the job's result
delivery (p4src/delivery.p4): everything the switch needs to aggregate one job."""

from __future__ import annotations

from dataclasses import dataclass

from aggwire import p4names
from aggwire.constants import MAX_WORKERS_PER_JOB, NUM_SLOTS
from controller.entries import EntrySpec
from controller.switch_connection import SwitchConnection
from p4rtproto.bytestrings import ipv4_to_int, mac_to_int


@dataclass(frozen=True)
class Worker:
    """One rank of a job: where it enters the switch and where its results go."""

    rank: int
    port: int
    mac: str
    ip: str
    udp_port: int


@dataclass(frozen=True)
class JobEntries:
    """A job as the data plane sees it: its pool of slots, group and workers."""

    job_id: int
    pool_base: int
    pool_size: int
    mcast_grp: int
    workers: tuple[Worker, ...]

    def validate(self) -> None:
        """Raise ValueError for a job the program cannot serve."""
        if not 1 <= self.job_id < 1 << 16:
            raise ValueError(f"job id {self.job_id} outside 1..65535")
        if not 1 <= len(self.workers) <= MAX_WORKERS_PER_JOB:
            raise ValueError(f"{len(self.workers)} workers: a job has 1..{MAX_WORKERS_PER_JOB}")
        if sorted(w.rank for w in self.workers) != list(range(len(self.workers))):
            raise ValueError("worker ranks must be 0..world_size-1, each once")
        if self.pool_size < 1 or self.pool_base + self.pool_size > NUM_SLOTS:
            raise ValueError(f"pool {self.pool_base}+{self.pool_size} outside the switch's "
                             f"{NUM_SLOTS} slots")
        if not 1 <= self.mcast_grp < 1 << 16:
            raise ValueError(f"multicast group {self.mcast_grp} outside 1..65535")


def job_group(job: JobEntries) -> tuple[int, list[tuple[int, int]]]:
    """The job's multicast group: (group id, [(port, instance)])."""
    # Replica instance rank + 1: egress tells replicas apart by egress_rid, and 0 means unicast.
    return job.mcast_grp, [(w.port, w.rank + 1) for w in job.workers]


def job_entries(job: JobEntries) -> list[EntrySpec]:
    """The job's table entries in install order: per worker its rewrite and worker entry, then the job."""
    out = []
    for w in job.workers:
        key = {"hdr.agg.job_id": job.job_id, "hdr.agg.rank": w.rank}
        out.append(EntrySpec.of(p4names.RESULT_REWRITE, key, p4names.TO_WORKER,
                                {"mac": mac_to_int(w.mac), "ip": ipv4_to_int(w.ip), "udp_port": w.udp_port}))
        out.append(EntrySpec.of(p4names.WORKER_TABLE, key, p4names.SET_WORKER,
                                {"port": w.port, "worker_bit": 1 << w.rank}))
    out.append(EntrySpec.of(p4names.JOB_TABLE, {"hdr.agg.job_id": job.job_id}, p4names.SET_JOB,
                            {"pool_base": job.pool_base, "pool_size": job.pool_size,
                             "num_workers": len(job.workers), "mcast_grp": job.mcast_grp}))
    return out


def install_job(conn: SwitchConnection, job: JobEntries) -> None:
    """Install the job: group first and job entry last, so no packet finds it half built."""
    job.validate()
    conn.write_multicast_group(*job_group(job))
    for e in job_entries(job):
        conn.insert_entry(e.table, dict(e.match), e.action, dict(e.params))


def remove_job(conn: SwitchConnection, job: JobEntries) -> None:
    """Remove the job's entries in the reverse order of install_job."""
    conn.delete_entry(p4names.JOB_TABLE, {"hdr.agg.job_id": job.job_id})
    for w in job.workers:
        key = {"hdr.agg.job_id": job.job_id, "hdr.agg.rank": w.rank}
        conn.delete_entry(p4names.WORKER_TABLE, key)
        conn.delete_entry(p4names.RESULT_REWRITE, key)
    conn.delete_multicast_group(job.mcast_grp)
