"""The running jobs of the database, checked before the controller serves them. Every row is
checked as a request would be (name, sizes, codec, addresses, ranks within the world, the
pool within the switch), so a hand-edited or semantically damaged database in a sound sqlite
file is refused at start with the way to start fresh, instead of failing later in a switch
supervisor or a request. Jobs whose switch is no longer configured, or whose pool cannot be
reserved again, end with that reason."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence

from homagg.api import validation as check
from homagg.api.errors import ControllerError
from homagg.control.config import ControllerConfig, SwitchConfig
from homagg.control.job_record import Job
from homagg.control.store import FRESH_HINT, Store, StoreError
from homagg.control.switches import ManagedSwitch
from homagg.control.tree import job_entries, locate_workers
from homagg.wire.constants import MAX_JOB_ID, NUM_SLOTS

log = logging.getLogger(__name__)


def _problem(job: Job) -> str:
    """What is wrong with a job row ("" when nothing is)."""
    numbers = [("world_size", job.world_size), ("pool_size", job.pool_size)]
    for w in job.workers.values():
        numbers += [("rank", w.rank), ("udp_port", w.udp_port), ("switch_port", w.switch_port)]
    wrong = [(k, v) for k, v in numbers if type(v) is not int]
    if wrong:
        return f"{wrong[0][0]} {wrong[0][1]!r} is not an integer"
    if not isinstance(job.job_id, int) or not 1 <= job.job_id <= MAX_JOB_ID:
        return f"job id {job.job_id!r} outside 1..{MAX_JOB_ID}"
    check.check_name(job.name)
    check.check_world_size(job.world_size)
    check.check_codec(job.codec)
    if not 1 <= job.pool_size <= NUM_SLOTS:
        return f"pool size {job.pool_size!r} outside 1..{NUM_SLOTS}"
    if not isinstance(job.token_hash, str) or not re.fullmatch(r"[0-9a-f]{64}", job.token_hash):
        return "its token hash is not a SHA-256 digest"
    if not isinstance(job.created, (int, float)) or not math.isfinite(job.created):
        return f"creation time {job.created!r}"
    if (job.switch is None) != (job.pool_base is None) or not isinstance(job.switch or "", str):
        return f"switch {job.switch!r} and pool base {job.pool_base!r} do not go together"
    for base in (job.pool_base, *job.leaves.values()):
        if base is not None and (
            not isinstance(base, int) or not 0 <= base <= NUM_SLOTS - job.pool_size
        ):
            return f"pool {base!r}+{job.pool_size} outside the {NUM_SLOTS} slots"
    if job.leaves and (job.switch is None or job.switch in job.leaves):
        return f"leaves {sorted(job.leaves)} without a parent switch apart from them"
    for rank, w in job.workers.items():
        check.check_rank(rank, job.world_size)
        check.check_mac(w.mac)
        check.check_ip(w.ip)
        check.check_udp_port(w.udp_port)
        check.check_switch_port(w.switch_port)
    if job.complete and job.switch is not None and not job.leaves:
        job.entries().validate()  # what the reconciliation would write (a tree's: restore_jobs)
    return ""


def check_restored(job: Job, database: str) -> None:
    """StoreError naming the job and the problem unless its row is a job this controller could
    have written (a switch that is no longer configured is not a problem of the row: the job
    ends with that reason)."""
    try:
        problem = _problem(job)
    except (ControllerError, TypeError, ValueError, OverflowError) as exc:
        problem = str(exc)
    if problem:
        raise StoreError(
            f"the controller database {database} holds an invalid row for job "
            f"{job.job_id!r}: {problem} (not written by this controller): {FRESH_HINT}"
        )


def unknown_jobs_refusal(store: Store, switch: str, job_ids: Sequence[int]) -> str:
    """Why the controller must not manage `switch`, which holds entries of `job_ids` at its
    first read-back ("" when the database has a row of each). The controller writes a job's
    row before any of its entries, so a sound database of this controller never lacks a job
    its switches hold: one that does is not the database of these switches (created new at
    a missing or wrong path, an older copy, another controller's), and removing the jobs
    would end running jobs that it cannot serve."""
    unknown = sorted(set(job_ids) - store.recorded(job_ids))
    if not unknown:
        return ""
    why = (
        "it was created at this start: a missing file, or a wrong path?"
        if store.created
        else "an older copy of the database, or another controller's?"
    )
    return (
        f"switch {switch} holds entries of job(s) {', '.join(map(str, unknown))} that the "
        f"database {store.path} has no record of ({why}); refusing to start rather than "
        "remove them, and nothing was written to the switch. Start with the database that "
        "goes with these switches; or with --remove-unknown-jobs to remove those jobs from "
        "the switches and keep this database's jobs (e.g. an older copy restored on purpose: "
        "the unknown jobs cannot be served, their tokens are not in it); or with "
        "--fresh-database to start with no jobs at all"
    )


def _reserve(job: Job, switches: Mapping[str, ManagedSwitch]) -> str:
    """Reserve the job's pools again (its switch's, a tree job's leaves' too); what is wrong,
    or "" (then every pool is reserved)."""
    taken: list[tuple[ManagedSwitch, int]] = []
    for name, base in job.pools.items():
        sw = switches.get(name)
        problem = f"switch {name} is no longer configured" if sw is None else ""
        if sw is not None:
            try:
                sw.pools.reserve(base, job.pool_size)
                taken.append((sw, base))
                continue
            except ValueError as exc:
                problem = f"its pool could not be restored: {exc}"
        for sw, base in taken:
            sw.pools.release(base)
        return problem
    if job.switch and job.switch not in switches:
        return f"switch {job.switch} is no longer configured"
    return ""


def _tree_problem(job: Job, configs: Mapping[str, SwitchConfig]) -> str:
    """What keeps a complete tree job from being written as the topology now stands."""
    if not (job.complete and job.leaves):
        return ""
    try:
        for entries in job_entries(job, configs).values():
            entries.validate()
    except (KeyError, ValueError) as exc:
        return f"its tree no longer fits the topology: {exc}"
    return ""


def restore_jobs(
    store: Store,
    switches: Mapping[str, ManagedSwitch],
    config: ControllerConfig,
    now: float,
    wall: Callable[[], float],
) -> dict[int, Job]:
    """The running jobs of the database with their pools re-reserved and fresh leases (a grace
    period: workers heartbeat again); StoreError for an invalid row."""
    jobs: dict[int, Job] = {}
    configs = {s.name: s for s in config.switches}
    for job in store.active_jobs():
        check_restored(job, str(store.path))
        problem = _reserve(job, switches)
        if not problem:
            problem = locate_workers(job, configs) or _tree_problem(job, configs)
            if problem:  # give back what _reserve took
                for name, base in job.pools.items():
                    switches[name].pools.release(base)
        if problem:
            log.warning("job %d ended on restart: %s", job.job_id, problem)
            job.ended, job.end_reason = wall(), problem
            store.save_job(job)
            continue
        for w in job.live_ranks():
            w.deadline = now + config.lease  # a grace period: workers heartbeat again
        job.idle_deadline = now + config.join_timeout
        jobs[job.job_id] = job
    return jobs
