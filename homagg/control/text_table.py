"""aggctl's human-readable output: aligned text tables rendered from the API's messages."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, headers first."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def duration(seconds: float) -> str:
    """12s, 3m04s, 2h05m."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def clock(unix: float) -> str:
    """Local date and time of a Unix timestamp (empty for 0)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix)) if unix else ""


def render_status(st: Any) -> str:
    """`aggctl status`."""
    head = (
        f"controller {st.listen}  version {st.version}  up {duration(st.uptime_s)}  "
        f"active jobs {st.active_jobs}\ndatabase   {st.database}\n"
    )
    rows = [
        (
            f"{s.name} (under {s.parent})" if s.parent else s.name,
            s.address,
            s.device_id,
            "yes" if s.connected else "NO",
            s.role.split(" ")[0] or "none",  # the primary's election id is in LAST ERROR
            f"{s.slots_used}/{s.slots_total}",
            s.jobs,
            s.hosts,
            s.service_ip,
            s.connects,
            s.pipeline_pushes,
            s.last_error or "-",
        )
        for s in st.switches
    ]
    return (
        head
        + "\n"
        + table(
            (
                "SWITCH",
                "ADDRESS",
                "DEVICE",
                "CONNECTED",
                "ROLE",
                "SLOTS USED",
                "JOBS",
                "HOSTS",
                "SERVICE IP",
                "CONNECTS",
                "PUSHES",
                "LAST ERROR",
            ),
            rows,
        )
    )


def render_jobs(jobs: Sequence[Any], ranks: bool) -> str:
    """`aggctl jobs` (with ranks: one more table, a row per rank)."""
    if not jobs:
        return "no jobs"
    rows = [
        (
            j.job_id,
            j.name,
            j.state,
            job_switches(j),
            f"{j.joined}/{j.world_size}",
            j.codec,
            f"{j.pool_base}..{j.pool_base + j.pool_size - 1}" if j.switch else "-",
            j.pool_size,
            clock(j.created),
            j.end_reason or "",
        )
        for j in jobs
    ]
    out = table(
        (
            "JOB",
            "NAME",
            "STATE",
            "SWITCH",
            "RANKS",
            "CODEC",
            "SLOTS",
            "POOL SIZE",
            "CREATED",
            "ENDED BECAUSE",
        ),
        rows,
    )
    return out + "\n\n" + _render_ranks(jobs) if ranks else out


def job_switches(job: Any) -> str:
    """A JobInfo's switches: the one of a flat job; a tree's parent and its leaves (uplink
    rank order), as "spine>leaf1,leaf2"."""
    if not job.tree:
        return job.switch or "-"
    return f"{job.switch}>" + ",".join(t.switch for t in job.tree if t.role == "leaf")


def _render_ranks(jobs: Sequence[Any]) -> str:
    """A row per joined rank of `jobs`: its addresses and what is left of its lease."""
    rank_rows = [
        (
            j.job_id,
            w.rank,
            w.ip,
            w.udp_port,
            w.mac,
            f"{w.switch}:{w.switch_port}" if j.tree else w.switch_port,
            "left" if w.left else ("-" if j.state == "ended" else f"{w.lease_remaining_s:.1f}s"),
        )
        for j in jobs
        for w in j.workers
    ]
    headers = ("JOB", "RANK", "IP", "UDP", "MAC", "SWITCH PORT", "LEASE LEFT")
    return table(headers, rank_rows) if rank_rows else "no ranks joined"


def render_pools(ranges: Sequence[Any], ports: Sequence[Any] = ()) -> str:
    """`aggctl pools`: the slot ranges, then the buffer of each port a running job uses."""
    rows = [
        (
            r.switch,
            f"{r.base}..{r.base + r.size - 1}",
            r.size,
            f"job {r.job_id} ({r.job_name})" if r.job_id else "free",
        )
        for r in ranges
    ]
    text = table(("SWITCH", "SLOTS", "SIZE", "OWNER"), rows)
    if not ports:
        return text
    buffers = [(p.switch, p.port, p.jobs, p.used, p.buffer, p.headroom) for p in ports]
    head = ("SWITCH", "PORT", "JOBS", "IN FLIGHT", "PORT BUFFER", "HEADROOM")
    return f"{text}\n\n{table(head, buffers)}"


def render_counters(switches: Sequence[Any], show_zero: bool) -> str:
    """`aggctl counters`: per switch, drops by reason, events, then packets per job and rank."""
    parts = []
    for sw in switches:
        if sw.error:
            parts.append(f"switch {sw.switch}: cannot read counters: {sw.error}")
            continue
        drops = [
            (where, d.name, d.packets, d.bytes)
            for where, values in (("ingress", sw.ingress_drops), ("egress", sw.egress_drops))
            for d in values
            if show_zero or d.packets
        ]
        events = [(e.name, e.packets) for e in sw.events if show_zero or e.packets]
        jobs = [(j.job_id, j.name, "all", j.packets, j.bytes) for j in sw.jobs]
        jobs += [(j.job_id, j.name, w.rank, w.packets, w.bytes) for j in sw.jobs for w in j.workers]
        jobs.sort(key=lambda r: (r[0], -1 if r[2] == "all" else r[2]))
        parts.append(
            f"switch {sw.switch}\n\n"
            + (table(("DROPPED AT", "REASON", "PACKETS", "BYTES"), drops) if drops else "no drops")
            + "\n\n"
            + (table(("EVENT", "PACKETS"), events) if events else "no aggregation events")
            + "\n\n"
            + (
                table(("JOB", "NAME", "RANK", "PACKETS", "BYTES"), jobs)
                if jobs
                else "no installed jobs"
            )
        )
    return "\n\n".join(parts) if parts else "no counters (the job has no switch yet)"
