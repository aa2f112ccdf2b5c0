"""Quotas of CreateJob: per job (the largest pool one job may ask for) and per operator
credential (its running jobs, and the slots they hold together on all switches: a tree job
holds its pool on every switch of its tree, so it counts once per switch), and who created
each job (a tenant sees and releases its own only). A refusal is RESOURCE_EXHAUSTED naming
the quota and its value."""

from __future__ import annotations

import threading

from homagg.api.credentials import Operator
from homagg.api.errors import ResourceExhausted
from homagg.api.validation import check_pool_size
from homagg.control.job_record import Job
from homagg.control.jobs import JobManager


def slots_held(job: Job) -> int:
    """Slots a job holds on all switches: its pool on each (one switch before it is placed:
    what its creation asked for)."""
    return job.pool_size * max(1, len(job.switches))


class Quotas:
    """Checks a new job against the quotas and records who created it (kept in the store, so
    the counts survive a restart). `admit` and `record` run under one lock per creation."""

    def __init__(self, manager: JobManager) -> None:
        self.m = manager
        self.lock = threading.Lock()
        self.owner: dict[int, str] = manager.store.owners()
        manager.slot_quota = self.check_growth  # a job that spreads to more switches

    def pool_size(self, requested: int) -> int:
        """The slots a request for `requested` (0: the default) takes, within max_job_slots."""
        cfg = self.m.config
        size = check_pool_size(requested, cfg.default_pool_size)
        if size > cfg.max_job_slots:
            raise ResourceExhausted(
                f"quota max_job_slots is {cfg.max_job_slots}: a job may not ask for {size} slots"
            )
        return size

    def admit(self, op: Operator | None, pool_size: int) -> None:
        """Refuse a job of `pool_size` slots that would take `op` over max_jobs or max_slots."""
        if op is None:
            return
        with self.m.lock:
            mine = [j for j in self.m.jobs.values() if self._owned(j, op)]
        if op.max_jobs and len(mine) >= op.max_jobs:
            raise ResourceExhausted(
                f"quota max_jobs of operator {op.name!r} is {op.max_jobs}: "
                f"{len(mine)} job(s) running; release one first"
            )
        held = sum(slots_held(j) for j in mine)
        if op.max_slots and held + pool_size > op.max_slots:
            raise ResourceExhausted(
                f"quota max_slots of operator {op.name!r} is {op.max_slots}: its jobs hold "
                f"{held} slot(s) on all switches, this one asks for {pool_size}"
            )

    def check_growth(self, job: Job, extra: int) -> None:
        """Refuse a join that would place `job` on more switches (a tree: its pool on each
        leaf and the parent) taking `extra` slots more than its creator's max_slots allows.
        Runs under the manager's lock, where joins and creations place pools."""
        name = self.owner.get(job.job_id)
        op = next((o for o in self.m.config.operators if o.name == name), None)
        if op is None or not op.max_slots:
            return
        held = sum(slots_held(j) for j in self.m.jobs.values() if self._owned(j, op))
        if held + extra > op.max_slots:
            raise ResourceExhausted(
                f"quota max_slots of operator {op.name!r} is {op.max_slots}: its jobs hold "
                f"{held} slot(s) on all switches, and job {job.job_id} would take {extra} "
                f"more on another switch of its tree ({job.pool_size} on each); release a "
                "job or ask for a smaller pool"
            )

    def record(self, job: Job, op: Operator | None) -> None:
        """Remember that `op` created `job` (the store wrote it with the job)."""
        if op is not None:
            self.owner[job.job_id] = op.name

    def wait_owner(self, job_id: int) -> str:
        """Whose share of the waiting WaitReady calls a call of `job_id` takes: the operator
        that created the job, or, for a job created without a credential, the job itself."""
        name = self.owner.get(job_id)
        return f"operator {name!r}" if name is not None else f"job {job_id} (no operator)"

    def owns(self, op: Operator | None, job: Job | int) -> bool:
        """Whether `op` may see and release `job` (or the job with that id): an admin (or
        the insecure mode's caller, None) every job, a tenant the jobs it created."""
        if op is None or op.admin:
            return True
        job_id = job if isinstance(job, int) else job.job_id
        return self.owner.get(job_id) == op.name

    def _owned(self, job: Job, op: Operator) -> bool:
        return job.ended is None and self.owner.get(job.job_id) == op.name
