"""Writing jobs to their switches outside the job manager's lock, so that heartbeats, Status
and operator reads never wait on a slow or hung switch (each P4Runtime call may take up to the
switch's `timeout`).

Ordering comes from each switch's `io` lock, taken before the manager's lock and held for a
whole write sequence: an install, a release, the removals of ended jobs and the supervisor's
reconciliation never interleave on one switch. Ending a job (manager's lock) queues its
entries in the switch's `pending_removals` and frees its pool at once; every write sequence
removes what is pending before it writes, so a job that reuses those slots is installed only
after the old entries are gone. An install re-checks the job under the manager's lock before
it writes and after: a job that ended meanwhile is removed right after its install, and a
job is marked installed only if the switch was not lost meanwhile (`ManagedSwitch.epoch`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from homagg.api.errors import FailedPrecondition, Unavailable
from homagg.control.aggregation import JobEntries
from homagg.control.job_record import Job
from homagg.control.switches import ManagedSwitch, SwitchRejected

log = logging.getLogger(__name__)


class JobBook(Protocol):
    """What the writes need of the job manager."""

    lock: threading.RLock
    changed: threading.Condition
    jobs: dict[int, Job]
    switches: dict[str, ManagedSwitch]

    def end_job(self, job: Job, reason: str, on_switch: bool = True) -> None: ...

    def entries_by_switch(self, job: Job) -> dict[str, JobEntries]: ...


class SwitchWrites:
    """Installs and removals of jobs on their switches (thread-safe)."""

    def __init__(self, book: JobBook) -> None:
        self.book = book

    def install(self, job: Job) -> None:
        """Install a complete job now where its switches are up (else their supervisors do, on
        reconnection): a tree's parent first, then each leaf, one switch's io lock at a time.
        Unavailable if a link fails, FailedPrecondition if a switch refuses (the job then
        ends)."""
        with self.book.lock:
            order = list(self.book.entries_by_switch(job))
        for name in order:
            sw = self.book.switches[name]
            with sw.io:
                self.install_held(sw, job)

    def install_held(self, sw: ManagedSwitch, job: Job) -> None:
        """Install the job's entries of one switch, its io lock held (a leaf's only once its
        parent holds the job: no partial sum goes up to a parent not ready for it)."""
        book = self.book
        with book.lock:
            if (
                book.jobs.get(job.job_id) is not job
                or sw.name in job.installed_on
                or not sw.connected
                or (job.leaves and sw.name != job.switch and job.switch not in job.installed_on)
            ):
                return
            entries, epoch = book.entries_by_switch(job)[sw.name], sw.epoch
        self.flush_removals(sw)
        try:
            sw.install(entries)
        except SwitchRejected as exc:
            reason = f"switch {sw.name} rejected its entries: {exc}"
            with book.lock:
                if book.jobs.get(job.job_id) is job:
                    # the install removed its writes; a tree's other switches may hold theirs
                    book.end_job(job, reason, on_switch=bool(job.leaves))
            raise FailedPrecondition(f"job {job.job_id} ended: {reason}") from None
        with book.lock:
            if book.jobs.get(job.job_id) is job and sw.epoch == epoch and sw.connected:
                job.installed_on.add(sw.name)
                log.info(
                    "job %d installed on %s: slots %d..%d, %d %s",
                    job.job_id,
                    sw.name,
                    entries.pool_base,
                    entries.pool_base + entries.pool_size - 1,
                    len(entries.workers),
                    "leaves" if job.leaves and sw.name == job.switch else "ranks",
                )
                book.changed.notify_all()
                if sw.name == job.switch:
                    for leaf in job.leaves:  # their supervisors install the rest if we fail
                        book.switches[leaf].kick()
        self.flush_removals(sw)  # the job, if it ended meanwhile

    def flush_removals(self, sw: ManagedSwitch) -> None:
        """Remove the entries of the switch's ended jobs (its io lock held). They stay pending
        while the switch is unreachable or a removal fails; the reconciliation that follows
        removes them then."""
        with self.book.lock:
            todo = list(sw.pending_removals.items()) if sw.connected else []
        for job_id, entries in todo:
            gone = sw.remove(entries)
            with self.book.lock:
                if gone and sw.pending_removals.get(job_id) is entries:
                    del sw.pending_removals[job_id]
            if not gone:
                break

    def release(self, job: Job, running: Callable[[], Job], reason: str) -> None:
        """End a complete job now: its entries removed from its switches (leaves first, the
        parent last), every one of their io locks held (in name order; no other writer holds
        two) so that no install comes between the removal and the end. Unavailable when a
        removal fails: the job keeps running, and the switches it was removed from install
        it again. `running` finds the job again under the lock (raising once it ended)."""
        book = self.book
        with book.lock:
            order = list(reversed(book.entries_by_switch(job)))
        with contextlib.ExitStack() as held:
            for name in sorted(order):
                held.enter_context(book.switches[name].io)
            done: list[str] = []
            try:
                for name in order:
                    sw = book.switches[name]
                    with book.lock:
                        entries = book.entries_by_switch(running())[name]
                        sw.require()
                    self.flush_removals(sw)
                    sw.remove(entries, strict=True)
                    done.append(name)
            except BaseException:
                with book.lock:
                    job.installed_on.difference_update(done)
                raise
            with book.lock:
                book.end_job(running(), reason, on_switch=False)

    def remove_now(self, job: Job) -> None:
        """Remove an ended job's entries before returning, as far as the switches allow (a
        tree's leaves first, then its parent)."""
        for name in reversed(job.switches):
            sw = self.book.switches[name]
            with sw.io:
                self.flush_removals(sw)

    def settle(self, sw: ManagedSwitch) -> None:
        """Removals first, then every complete job with a pool on the switch that is not
        installed there (the switch's io lock held): what the supervisor does on each poll."""
        self.flush_removals(sw)
        with self.book.lock:
            todo = [
                j
                for j in self.book.jobs.values()
                if sw.name in j.switches and j.complete and sw.name not in j.installed_on
            ]
        for job in todo:
            with contextlib.suppress(Unavailable, FailedPrecondition):
                self.install_held(sw, job)
