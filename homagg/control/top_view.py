"""`aggctl top`'s numbers: one sample of a running controller (the Status, ListJobs and
GetCounters calls the caller's credential may make), and the view between two samples: per
switch its state, event, resend and drop rates, and its jobs with their packet rates
(counter deltas over the time between the samples)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc

NO_SWITCH = ""  # the group of jobs whose switch is not known yet (several switches, no join)


@dataclass
class Sample:
    """What the controller answered at one moment; `status` and `counters` are None when the
    credential may not read them (or the call was refused), and `refusals` says why."""

    at: float  # time.monotonic() when the sample was taken
    wall: float  # Unix time of the same moment
    jobs: list[Any]  # JobInfo messages (a tenant's: its own)
    status: Any | None = None  # StatusResponse
    counters: Any | None = None  # GetCountersResponse
    refusals: dict[str, str] = field(default_factory=dict)  # call -> "CODE: details"


class Sampler:
    """Takes samples through a ControllerClient. A call the credential is refused
    (PERMISSION_DENIED) is not asked again: the credential does not change while top runs."""

    OPTIONAL = ("Status", "GetCounters")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.refusals: dict[str, str] = {}

    def take(self) -> Sample:
        """One sample; grpc.RpcError when the controller cannot be asked (e.g. UNAVAILABLE)."""
        status = self._optional("Status", self.client.status)
        jobs = list(self.client.list_jobs(False).jobs)
        counters = self._optional("GetCounters", self.client.counters)
        return Sample(time.monotonic(), time.time(), jobs, status, counters, dict(self.refusals))

    def _optional(self, name: str, call: Any) -> Any | None:
        """The answer of `call`, or None once the credential was refused it."""
        if name in self.refusals:
            return None
        try:
            return call()
        except grpc.RpcError as exc:
            if not isinstance(exc, grpc.Call) or exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            self.refusals[name] = f"PERMISSION_DENIED: {exc.details()}"
            return None


@dataclass
class JobRow:
    """One job: what ListJobs says, its switch counters and their rates (None: unknown)."""

    job_id: int
    name: str
    state: str
    switch: str
    joined: int
    world_size: int
    codec: str
    pool_size: int
    gave_ups: int = 0  # calls a rank gave up and told the controller (the ranks fell back)
    packets: int | None = None  # packets of the job the switch counted (all ranks)
    bytes: int | None = None
    packets_per_s: float | None = None
    bytes_per_s: float | None = None


@dataclass
class SwitchRow:
    """One switch: its state (None: not readable by this credential), its rates, its jobs."""

    name: str
    connected: bool | None = None
    role: str = ""
    slots_used: int | None = None
    slots_total: int | None = None
    error: str = ""  # why its counters could not be read
    contributions_per_s: float | None = None
    results_per_s: float | None = None
    resent_per_s: float | None = None  # results resent to retransmitted contributions
    drops_per_s: float | None = None
    drops_per_s_by_reason: dict[str, float] = field(default_factory=dict)  # the non-zero ones
    jobs: list[JobRow] = field(default_factory=list)


@dataclass
class TopView:
    """One refresh of `aggctl top`: the controller, the switches and why anything is missing."""

    controller: str
    time: float  # Unix time of the sample
    interval_s: float | None  # time between the two samples the rates come from
    uptime_s: float | None
    switches: list[SwitchRow]
    notes: list[str]


def _rate(now: int | None, before: int | None, dt: float | None) -> float | None:
    """Per second between two counter readings; None when unknown or reset (a restarted
    switch counts from zero again)."""
    if now is None or before is None or not dt or dt <= 0 or now < before:
        return None
    return (now - before) / dt


def _events(sw: Any) -> dict[str, int]:
    return {e.name: e.packets for e in sw.events}


def _drops(sw: Any) -> dict[str, int]:
    """Ingress and egress drops summed per reason."""
    out: dict[str, int] = {}
    for d in [*sw.ingress_drops, *sw.egress_drops]:
        out[d.name] = out.get(d.name, 0) + d.packets
    return out


def _by_switch(sample: Sample | None) -> dict[str, Any]:
    """The readable SwitchCounters of a sample by switch name."""
    if sample is None or sample.counters is None:
        return {}
    return {sw.switch: sw for sw in sample.counters.switches if not sw.error}


def _switch_rates(row: SwitchRow, now: Any, before: Any | None, dt: float | None) -> None:
    """Fill the switch-wide rates of `row` from two readings of its counters."""
    ev_now, ev_before = _events(now), _events(before) if before is not None else {}
    row.contributions_per_s = _rate(ev_now.get("CONTRIBUTION"), ev_before.get("CONTRIBUTION"), dt)
    row.results_per_s = _rate(ev_now.get("RESULT"), ev_before.get("RESULT"), dt)
    row.resent_per_s = _rate(ev_now.get("RESENT"), ev_before.get("RESENT"), dt)
    dr_now, dr_before = _drops(now), _drops(before) if before is not None else {}
    rates = {r: _rate(n, dr_before.get(r, 0), dt) for r, n in dr_now.items()}  # unlisted: 0
    if before is not None and all(v is not None for v in rates.values()):
        row.drops_per_s = sum(v for v in rates.values() if v is not None)
        row.drops_per_s_by_reason = {r: v for r, v in sorted(rates.items()) if v}


def _job_row(job: Any, now: Any | None, before: Any | None, dt: float | None) -> JobRow:
    row = JobRow(
        job.job_id,
        job.name,
        job.state,
        job.switch,
        job.joined,
        job.world_size,
        job.codec,
        job.pool_size,
        job.gave_ups,
    )
    if now is not None:
        row.packets, row.bytes = now.packets, now.bytes
        if before is not None:
            row.packets_per_s = _rate(now.packets, before.packets, dt)
            row.bytes_per_s = _rate(now.bytes, before.bytes, dt)
    return row


def _switch_rows(prev: Sample | None, cur: Sample, dt: float | None) -> dict[str, SwitchRow]:
    """Every switch the sample names (status, counters, jobs), in the controller's order."""
    rows: dict[str, SwitchRow] = {}
    for s in cur.status.switches if cur.status is not None else []:
        rows[s.name] = SwitchRow(
            s.name, s.connected, s.role.split(" ")[0] or "none", s.slots_used, s.slots_total
        )
    for sw in cur.counters.switches if cur.counters is not None else []:
        row = rows.setdefault(sw.switch, SwitchRow(sw.switch))
        row.error = sw.error
    before, now = _by_switch(prev), _by_switch(cur)
    for name, sw in now.items():
        _switch_rates(rows[name], sw, before.get(name), dt)
    return rows


def _job_counts(sample: Sample | None) -> dict[int, Any]:
    """The JobCounters of a sample by job id."""
    return {j.job_id: j for sw in _by_switch(sample).values() for j in sw.jobs}


def _notes(cur: Sample, dt: float | None) -> list[str]:
    """One line per thing this view cannot show, and why."""
    notes = []
    if "Status" in cur.refusals:
        notes.append(f"switch state not shown (Status: {cur.refusals['Status']})")
    if "GetCounters" in cur.refusals:
        notes.append(f"jobs shown without counters (GetCounters: {cur.refusals['GetCounters']})")
    elif dt is None:
        notes.append("rates from the next refresh on")
    return notes


def build_view(prev: Sample | None, cur: Sample, controller: str) -> TopView:
    """The view of `cur`, with rates over the time since `prev` (None: no rates yet)."""
    dt = cur.at - prev.at if prev is not None else None
    rows = _switch_rows(prev, cur, dt)
    counts_now, counts_before = _job_counts(cur), _job_counts(prev)
    for job in sorted(cur.jobs, key=lambda j: j.job_id):
        row = _job_row(job, counts_now.get(job.job_id), counts_before.get(job.job_id), dt)
        rows.setdefault(job.switch, SwitchRow(job.switch)).jobs.append(row)
    switches = sorted(rows.values(), key=lambda r: r.name == NO_SWITCH)  # stable: order kept
    uptime = cur.status.uptime_s if cur.status is not None else None
    return TopView(controller, cur.wall, dt, uptime, switches, _notes(cur, dt))
