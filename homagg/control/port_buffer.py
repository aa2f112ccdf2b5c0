"""Each switch port's buffer, shared by every job with a rank on that port: a rank keeps a
pool's worth of chunks in flight and their results reach its port back to back, so the
slots in flight on a port are the pool sizes of the jobs with a rank there (a rank that left
keeps its entries, so it counts, until its job ends); a tree job's uplinks count too (a
leaf's partial sums go up its parent_port, the parent's results down its port_on_parent).
Derived from the running jobs only, so a release gives the headroom back and a restart
(jobs restored from the store) restores the accounting."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from homagg.control.job_record import Job, JobWorker
from homagg.control.tree import Configs


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


def job_ports(job: Job, configs: Configs) -> list[tuple[str | None, int]]:
    """The (switch, port) pairs where the job keeps a pool's worth of frames in flight: each
    rank's port, and in a tree each leaf's uplink port and the parent's port toward it
    (partial sums up, results down), as `configs` says."""
    ports = [(worker_switch(job, w), w.switch_port) for w in job.workers.values()]
    for name in job.leaves:
        c = configs.get(name)
        if c is not None and c.parent_port is not None and c.port_on_parent is not None:
            ports += [(name, c.parent_port), (job.switch, c.port_on_parent)]
    return ports


def port_load(jobs: Iterable[Job], switch: str, port: int, configs: Configs) -> tuple[int, int]:
    """(slots in flight, jobs) on `port` of `switch`: each rank of a job attached there on
    that port, and each tree uplink there (with `configs`), counts its job's pool."""
    used = count = 0
    for job in jobs:
        uses = sum(1 for where in job_ports(job, configs) if where == (switch, port))
        used += uses * job.pool_size
        count += uses > 0
    return used, count


def port_buffers(
    jobs: Iterable[Job], switch: str, buffer: int, configs: Configs
) -> list[PortBuffer]:
    """Every port of `switch` with a rank (or a tree uplink) of a running job on it, in port
    order."""
    jobs = list(jobs)
    ports = sorted({p for j in jobs for s, p in job_ports(j, configs) if s == switch})
    return [PortBuffer(switch, p, buffer, *port_load(jobs, switch, p, configs)) for p in ports]


def port_headroom(
    jobs: Iterable[Job], switch: str, port: int, buffer: int, configs: Configs
) -> int:
    """Slots still free in `port`'s buffer of `switch`."""
    return max(0, buffer - port_load(jobs, switch, port, configs)[0])
