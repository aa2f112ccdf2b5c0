"""When leases end jobs: a job ends when any live rank's lease ran out, or when no rank holds
a lease (created but nobody joined, or every rank left before the world was complete) for
`join_timeout`. The job manager's reaper thread applies this every `reap_interval`."""

from __future__ import annotations

from collections.abc import Iterable

from homagg.control.config import ControllerConfig
from homagg.control.job_record import Job


def reap_interval(lease: float) -> float:
    """How often the leases are checked: an expired lease ends its job this much after it ran
    out, at most."""
    return min(0.5, lease / 4)


def expired(jobs: Iterable[Job], now: float, config: ControllerConfig) -> list[tuple[Job, str]]:
    """The jobs whose leases ended them at monotonic time `now`, each with why."""
    due = []
    for job in jobs:
        live = job.live_ranks()
        late = [str(w.rank) for w in live if w.deadline < now]
        if late:
            ranks = f"rank {late[0]}" if len(late) == 1 else f"ranks {', '.join(late)}"
            due.append((job, f"lease of {ranks} expired (no heartbeat for {config.lease:g} s)"))
        elif not live and job.idle_deadline < now:
            due.append((job, f"no live rank for {config.join_timeout:g} s"))
    return due
