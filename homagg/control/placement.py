"""Where a job lives: the switch a worker is attached to (per the configured topology), the
job's pool on that switch within its job and worker table sizes, and the worker endpoints a
switch can tell apart. Pure functions over the manager's jobs and switches (its lock held)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from homagg.api.errors import AlreadyExists, FailedPrecondition, InvalidArgument, ResourceExhausted
from homagg.control.job_record import Job, JobWorker
from homagg.control.pools import PoolExhausted
from homagg.control.port_buffer import port_headroom
from homagg.control.switches import ManagedSwitch
from homagg.p4rt.bytestrings import mac_to_int

log = logging.getLogger(__name__)


def attached_port(switches: Mapping[str, ManagedSwitch], ip: str) -> int:
    """The switch port a host is attached to, per the configured topology."""
    for sw in switches.values():
        host = sw.config.host_by_ip(ip)
        if host is not None:
            return host.switch_port
    raise InvalidArgument(
        f"{ip} is not a host of any configured switch, so its switch port is unknown: "
        "add the host to the controller's configuration or pass the switch port"
    )


def switch_for(switches: Mapping[str, ManagedSwitch], job: Job, worker: JobWorker) -> ManagedSwitch:
    """The switch the worker is on; a known host must match the topology."""
    for sw in switches.values():
        host = sw.config.host_by_ip(worker.ip)
        if host is None:
            continue
        if mac_to_int(host.mac) != mac_to_int(worker.mac) or host.switch_port != worker.switch_port:
            raise InvalidArgument(
                f"per the topology {worker.ip} is {host.mac} on port {host.switch_port} of "
                f"switch {sw.name}, not {worker.mac} on port {worker.switch_port}"
            )
        if job.switch is not None and job.switch != sw.name:
            raise FailedPrecondition(
                f"job {job.job_id} runs on switch {job.switch} but {worker.ip} is attached "
                f"to {sw.name}: jobs spanning several switches are not supported"
            )
        return sw
    if job.switch is not None:
        return switches[job.switch]
    if len(switches) == 1:
        return next(iter(switches.values()))
    raise InvalidArgument(
        f"{worker.ip} is not a host of any configured switch, so the job's switch "
        f"cannot be chosen: name the switch in CreateJob"
    )


def check_endpoint_free(jobs: Iterable[Job], job: Job, worker: JobWorker, switch: str) -> None:
    """AlreadyExists when another rank of any running job on `switch` receives at the worker's
    (IP, UDP port): the switch sends both their results there, and the worker could not tell
    which rank's stream a result belongs to (a rank that left keeps its entries until its job
    ends, so it counts)."""
    endpoint = (worker.ip, worker.udp_port)
    for other in jobs:
        if other.switch != switch and other is not job:
            continue
        clash = next((w for w in other.workers.values() if (w.ip, w.udp_port) == endpoint), None)
        if clash is None:
            continue
        if other is job:
            raise AlreadyExists(
                f"rank {clash.rank} of job {job.job_id} already receives at "
                f"{worker.ip}:{worker.udp_port}"
            )
        raise AlreadyExists(
            f"{worker.ip}:{worker.udp_port} is already used by rank {clash.rank} of job "
            f"{other.job_id} ({other.name}) on switch {switch}: the switch could not tell "
            "their results apart; bind another UDP port and join with it"
        )


def place(jobs: Iterable[Job], job: Job, sw: ManagedSwitch) -> None:
    """Allocate the job's pool on the switch (within its job and worker table sizes), of at
    most the switch's `max_pool_size` slots: a rank has a pool's worth of chunks in flight,
    which reach its switch port back to back, and a target buffers only so many frames per
    port (BMv2 about 1,300: docs/bmv2.md). A larger request gets that many slots."""
    there = [j for j in jobs if j.switch == sw.name]
    if len(there) >= sw.max_jobs:
        raise ResourceExhausted(
            f"switch {sw.name} already runs {len(there)} jobs, all its job table holds"
        )
    ranks = sum(j.world_size for j in there)
    if ranks + job.world_size > sw.max_workers:
        raise ResourceExhausted(
            f"switch {sw.name} has room for {sw.max_workers - ranks} more ranks, "
            f"the job has {job.world_size}"
        )
    size = min(job.pool_size, sw.config.max_pool_size)
    try:
        job.pool_base = sw.pools.allocate(size)
    except PoolExhausted as exc:
        raise PoolExhausted(f"switch {sw.name}: {exc}") from None
    if size < job.pool_size:
        log.info(
            "job %d asked for a pool of %d; switch %s takes at most %d chunks in flight per "
            "rank (max_pool_size)",
            job.job_id,
            job.pool_size,
            sw.name,
            size,
        )
    job.pool_size, job.switch = size, sw.name


def fit_port(jobs: Iterable[Job], job: Job, worker: JobWorker, sw: ManagedSwitch) -> int | None:
    """Make room for the rank's pool in its port's buffer (`port_buffer`), which every job with
    a rank on that port shares. The job's first rank may shrink the pool to the headroom (no
    rank holds an assignment yet: the pool is granted, as `max_pool_size` caps it); a later
    rank's pool is fixed, and ResourceExhausted names the port and its headroom. Returns the
    size before a shrink (for `unfit_port`), or None."""
    room = port_headroom(jobs, sw.name, worker.switch_port, sw.config.port_buffer)
    if room >= job.pool_size:
        return None
    if job.workers or room < 1:
        raise ResourceExhausted(
            f"switch {sw.name} port {worker.switch_port} (rank {worker.rank}'s) has room for "
            f"{room} more slots in flight of its port_buffer {sw.config.port_buffer}, "
            f"shared by the jobs with ranks there; job {job.job_id}'s pool is {job.pool_size}: "
            "wait for a job on that port to end, or create the job with a smaller pool_size"
        )
    assert job.pool_base is not None
    old = job.pool_size
    sw.pools.release(job.pool_base)
    sw.pools.reserve(job.pool_base, room)  # the head of its own range: always free
    job.pool_size = room
    log.info(
        "job %d: pool %d shrunk to %d, the headroom of switch %s port %d (port_buffer %d)",
        job.job_id,
        old,
        room,
        sw.name,
        worker.switch_port,
        sw.config.port_buffer,
    )
    return old


def unfit_port(job: Job, sw: ManagedSwitch, old: int | None) -> None:
    """Undo `fit_port`'s shrink (the join failed after it)."""
    if old is None or job.pool_base is None:
        return
    sw.pools.release(job.pool_base)
    sw.pools.reserve(job.pool_base, old)
    job.pool_size = old


def admit(
    switches: Mapping[str, ManagedSwitch], jobs: Iterable[Job], job: Job, worker: JobWorker
) -> Callable[[], None]:
    """Make room for a joining rank on its switch: its endpoint free there, the job's pool
    placed with its first rank (when its switch was not known at creation) and within the
    rank's port buffer (`fit_port`). Returns what undoes it, for a join that fails after."""
    sw = switch_for(switches, job, worker)
    check_endpoint_free(jobs, job, worker, sw.name)
    placed = job.switch is None
    if placed:
        place(jobs, job, sw)
    try:
        shrunk = fit_port(jobs, job, worker, sw)
    except BaseException:
        if placed:
            unplace(switches, job)
        raise

    def undo() -> None:
        unfit_port(job, sw, shrunk)
        if placed:
            unplace(switches, job)

    return undo


def unplace(switches: Mapping[str, ManagedSwitch], job: Job) -> None:
    """Give the job's pool back (a creation or first join that failed)."""
    if job.switch is not None and job.pool_base is not None:
        switches[job.switch].pools.release(job.pool_base)
    job.switch = job.pool_base = None
