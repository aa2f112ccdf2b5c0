"""What operators read: the state of each switch, the pools (allocated and free ranges), the
ports' buffers and the counters, taken from a JobManager under its lock (never held while a
switch is read)."""

from __future__ import annotations

from dataclasses import dataclass

from homagg.api.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from homagg.control.counters import SwitchCounters, read_counters
from homagg.control.jobs import JobManager
from homagg.control.port_buffer import PortBuffer, port_buffers
from homagg.control.switch_connection import SwitchConnection, SwitchError


@dataclass(frozen=True)
class SwitchState:
    """One switch as the controller sees it."""

    name: str
    address: str
    device_id: int
    connected: bool
    last_error: str
    connects: int
    pipeline_pushes: int
    slots_total: int
    slots_used: int
    jobs: int
    hosts: int
    mac: str
    service_ip: str
    role: str = "none"
    parent: str = ""  # a leaf's configured parent


@dataclass(frozen=True)
class ControllerStatus:
    """The controller and its switches."""

    started: float
    database: str
    active_jobs: int
    switches: list[SwitchState]


@dataclass(frozen=True)
class PoolRange:
    """A range of one switch's slots: a job's pool, or free (job_id 0)."""

    switch: str
    base: int
    size: int
    job_id: int = 0
    job_name: str = ""


def controller_status(m: JobManager) -> ControllerStatus:
    """A snapshot of the controller and every switch."""
    with m.lock:
        switches = []
        for sw in m.switches.values():
            c = sw.config
            switches.append(
                SwitchState(
                    c.name,
                    c.address,
                    c.device_id,
                    sw.connected,
                    sw.last_error,
                    sw.connects,
                    sw.pipeline_pushes,
                    sw.pools.total,
                    sw.pools.total - sw.pools.slots_free(),
                    sum(1 for j in m.jobs.values() if c.name in j.switches),
                    len(c.hosts),
                    c.mac,
                    c.service_ip,
                    sw.role,
                    c.parent,
                )
            )
        return ControllerStatus(m.started, str(m.store.path), len(m.jobs), switches)


def _switch_names(m: JobManager, switch: str) -> list[str]:
    if switch and switch not in m.switches:
        raise InvalidArgument(f"switch: no switch {switch!r} (configured: {', '.join(m.switches)})")
    return [switch] if switch else list(m.switches)


def pool_ranges(m: JobManager, switch: str = "") -> list[PoolRange]:
    """Allocated and free ranges of one or every switch, in slot order."""
    with m.lock:
        out = []
        for name in _switch_names(m, switch):
            owners = {j.pools[name]: j for j in m.jobs.values() if name in j.pools}
            pools = m.switches[name].pools
            ranges = [
                PoolRange(name, base, size, owners[base].job_id, owners[base].name)
                for base, size in pools.used_ranges()
            ]
            ranges += [PoolRange(name, base, size) for base, size in pools.free_ranges()]
            out += sorted(ranges, key=lambda r: r.base)
        return out


def port_buffer_views(m: JobManager, switch: str = "") -> list[PortBuffer]:
    """The slots in flight and headroom of every port of one or every switch with a rank of a
    running job on it."""
    with m.lock:
        out = []
        for name in _switch_names(m, switch):
            buffer = m.switches[name].config.port_buffer
            out += port_buffers(m.jobs.values(), name, buffer, m.configs)
        return out


def job_counters(m: JobManager, switch: str = "", job_id: int = 0) -> list[SwitchCounters]:
    """Counters of one or every switch (only one job's with job_id). A switch that cannot be
    read is reported with its error, or is Unavailable when it was asked for by name or job.
    The switches are read outside the manager's lock (a slow switch delays only this call)."""
    with m.lock:
        if job_id:
            job = m.jobs.get(job_id)
            if job is None:
                if m.store.job(job_id) is not None:
                    raise FailedPrecondition(
                        f"job {job_id} has ended: its entries and counters are gone"
                    )
                raise NotFound(f"no job {job_id}")
            if job.switch is None:
                return []
            names = list(job.switches)
        else:
            names = _switch_names(m, switch)
        job_names = {j.job_id: j.name for j in m.jobs.values()}
        sessions: dict[str, SwitchConnection | Unavailable] = {}
        for name in names:
            try:
                sessions[name] = m.switches[name].require()
            except Unavailable as exc:
                sessions[name] = exc
    out = []
    for name, session in sessions.items():
        try:
            if isinstance(session, Unavailable):
                raise session
            out.append(read_counters(session, name, job_names, job_id or None))
        except (Unavailable, SwitchError) as exc:
            if job_id or switch:
                raise Unavailable(str(exc)) from None
            out.append(SwitchCounters(name, error=str(exc)))
    return out
