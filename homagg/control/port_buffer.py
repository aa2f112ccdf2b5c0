"""Each switch port's buffer, shared by every job with a rank on that port: a rank keeps a
pool's worth of chunks in flight and their results reach its port back to back, so the
slots in flight on a port are the pool sizes of the jobs with a rank there (a rank that left
keeps its entries, so it counts, until its job ends). Derived from the running jobs only,
so a release gives the headroom back and a restart (jobs restored from the store) restores
the accounting."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from homagg.control.job_record import Job, JobWorker


@dataclass(frozen=True)
class PortBuffer:
    """One switch port's slots in flight (`used`) against its buffer (`buffer`, the switch's
    `port_buffer`), and the jobs with a rank on it."""

    switch: str
    port: int
    buffer: int
    used: int
    jobs: int

    @property
    def headroom(self) -> int:
        """Slots a further rank's pool may still take on this port (0 when full or over)."""
        return max(0, self.buffer - self.used)


def worker_switch(job: Job, worker: JobWorker) -> str | None:
    """The switch a rank is attached to: its own (a tree job's leaf), else its job's."""
    return worker.switch or job.switch


def port_load(jobs: Iterable[Job], switch: str, port: int) -> tuple[int, int]:
    """(slots in flight, jobs) on `port` of `switch`: each rank of a job attached there on
    that port counts its job's pool. (A tree's uplink ports are not counted.)"""
    used = count = 0
    for job in jobs:
        ranks = sum(
            1
            for w in job.workers.values()
            if worker_switch(job, w) == switch and w.switch_port == port
        )
        used += ranks * job.pool_size
        count += ranks > 0
    return used, count


def port_buffers(jobs: Iterable[Job], switch: str, buffer: int) -> list[PortBuffer]:
    """Every port of `switch` with a rank of a running job on it, in port order."""
    jobs = list(jobs)
    ports = sorted(
        {w.switch_port for j in jobs for w in j.workers.values() if worker_switch(j, w) == switch}
    )
    return [PortBuffer(switch, p, buffer, *port_load(jobs, switch, p)) for p in ports]


def port_headroom(jobs: Iterable[Job], switch: str, port: int, buffer: int) -> int:
    """Slots still free in `port`'s buffer of `switch`."""
    return max(0, buffer - port_load(jobs, switch, port)[0])
