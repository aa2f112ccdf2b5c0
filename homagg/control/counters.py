"""The switch's P4Runtime counters, named: drops per reason (ingress and egress), aggregation
events, and packets per job and per worker from the direct counters of job_table and
worker_table."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from homagg.control.switch_connection import SwitchConnection
from homagg.wire import p4names
from homagg.wire.constants import DropReason, Event


@dataclass
class CounterValue:
    """One cell of an indexed counter, with the name of its index."""

    name: str
    index: int
    packets: int
    bytes: int


@dataclass
class WorkerCount:
    """Packets of one rank (its worker_table entry)."""

    rank: int
    packets: int
    bytes: int


@dataclass
class JobCount:
    """Packets of one job (its job_table entry) and of each of its ranks."""

    job_id: int
    name: str
    packets: int
    bytes: int
    workers: list[WorkerCount] = field(default_factory=list)


@dataclass
class SwitchCounters:
    """Every counter of one switch; `error` is set (and the rest empty) when it could not be
    read."""

    switch: str
    error: str = ""
    ingress_drops: list[CounterValue] = field(default_factory=list)
    egress_drops: list[CounterValue] = field(default_factory=list)
    events: list[CounterValue] = field(default_factory=list)
    jobs: list[JobCount] = field(default_factory=list)


def _named(
    cells: dict[int, tuple[int, int]], names: type[IntEnum], only: tuple[IntEnum, ...] = ()
) -> list[CounterValue]:
    """The cells of the `only` members (default: every member), and any other cell ever counted."""
    listed = {int(m) for m in (only or names)}
    label = {int(m): m.name for m in names}
    out = []
    for index in sorted(set(cells) | listed):
        packets, nbytes = cells.get(index, (0, 0))
        if index in listed or packets or nbytes:
            out.append(CounterValue(label.get(index, f"index_{index}"), index, packets, nbytes))
    return out


def read_counters(
    conn: SwitchConnection, switch: str, job_names: dict[int, str], job_id: int | None = None
) -> SwitchCounters:
    """Read every counter of the switch; job_names names the jobs (and, with job_id, only that
    one)."""
    result = SwitchCounters(switch)
    reasons = tuple(r for r in DropReason if r != DropReason.NONE)
    result.ingress_drops = _named(conn.read_counter(p4names.INGRESS_DROPS), DropReason, reasons)
    # Egress only drops results without a recipient; other cells are listed only if ever counted.
    result.egress_drops = _named(
        conn.read_counter(p4names.EGRESS_DROPS), DropReason, (DropReason.NO_RECIPIENT,)
    )
    result.events = _named(conn.read_counter(p4names.EVENT_COUNTER), Event)
    jobs: dict[int, JobCount] = {}
    for entry, packets, nbytes in conn.read_direct_counters(p4names.JOB_TABLE):
        jid = int(entry.match["hdr.agg.job_id"])  # type: ignore[arg-type]
        if job_id is None or jid == job_id:
            jobs[jid] = JobCount(jid, job_names.get(jid, ""), packets, nbytes)
    for entry, packets, nbytes in conn.read_direct_counters(p4names.WORKER_TABLE):
        jid, rank = int(entry.match["hdr.agg.job_id"]), int(entry.match["hdr.agg.rank"])  # type: ignore[arg-type]
        if jid in jobs:
            jobs[jid].workers.append(WorkerCount(rank, packets, nbytes))
    for job in jobs.values():
        job.workers.sort(key=lambda w: w.rank)
    result.jobs = [jobs[j] for j in sorted(jobs)]
    return result
