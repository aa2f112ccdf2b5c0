"""The job lifecycle across the configured switches: create (pool allocated as soon as the
switch is known), join (the join completing the world installs the job), wait, heartbeat
leases, leave, release, and expiry. State changes are persisted before they are applied to
a switch; a failing request changes nothing. The manager's lock guards the jobs, the pools
and the leases and is never held during a P4Runtime call: switch writes run outside it,
ordered per switch by the switch's io lock (docs/controller.md, "Locks and switch writes")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from homagg.api import validation as check
from homagg.api.assignment import Assignment
from homagg.api.errors import (
    AlreadyExists,
    ControllerError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from homagg.control.aggregation import JobEntries
from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.config import ControllerConfig
from homagg.control.job_record import GaveUp, Job, JobState, JobWorker
from homagg.control.leases import expired, reap_interval
from homagg.control.placement import admit, attached_port, place, unplace
from homagg.control.restore import restore_jobs, unknown_jobs_refusal
from homagg.control.store import Store
from homagg.control.switch_writes import SwitchWrites
from homagg.control.switches import ManagedSwitch, UnknownJobs
from homagg.control.tree import check_world_fits, job_entries, locate_workers
from homagg.wire.constants import AGG_UDP_PORT, MAX_JOB_ID

log = logging.getLogger(__name__)


class JobManager:
    """Jobs, pools and leases; every public method is thread-safe and raises ControllerError."""

    def __init__(
        self,
        config: ControllerConfig,
        store: Store,
        artifacts: tuple[Path, Path] = (P4INFO_PATH, BMV2_JSON_PATH),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        poll_interval: float = 0.2,
        max_backoff: float = 5.0,
        remove_unknown_jobs: bool = False,
    ) -> None:
        self.config, self.store = config, store
        self.configs = {s.name: s for s in config.switches}
        # A switch holding jobs the database does not know at its first read-back stops the
        # controller (refusal, refused) unless told to remove them (homagg/control/restore.py).
        self.remove_unknown_jobs = remove_unknown_jobs
        self.refusal = ""
        self.refused = threading.Event()
        self.clock, self.wall = clock, wall
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on every job state change
        self.switches = {
            s.name: ManagedSwitch(
                s, self.lock, self, artifacts, poll_interval, max_backoff, self.configs
            )
            for s in config.switches
        }
        self.jobs: dict[int, Job] = {}
        # checks a join that spreads a job to more switches against its creator's slot
        # quota (Quotas sets it; raises ResourceExhausted): (job, slots more)
        self.slot_quota: Callable[[Job, int], None] | None = None
        self.lease_expiries = 0  # jobs their leases ended (under the lock; for the metrics)
        self.started = wall()
        # No job is created before every switch was read back since the start: a database
        # older than a switch's state (or started fresh) must not hand out an id the switch
        # still holds (Store.raise_next_job_id).
        self.unread = set(self.switches)
        self.writes = SwitchWrites(self)
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._restore()

    # -- lifecycle of the manager ---------------------------------------------------------

    def _restore(self) -> None:
        self.jobs = restore_jobs(self.store, self.switches, self.config, self.clock(), self.wall)
        if self.jobs:
            log.info("restored %d job(s) from %s", len(self.jobs), self.store.path)

    def start(self) -> None:
        """Start the switch supervisors and the lease reaper."""
        for sw in self.switches.values():
            sw.start()
        self._reaper = threading.Thread(target=self._reap_loop, name="lease-reaper", daemon=True)
        self._reaper.start()

    def stop(self) -> None:
        """Stop the threads and close the switch sessions; jobs stay installed and persisted."""
        self._stop.set()
        with self.lock:
            self.changed.notify_all()
        if self._reaper is not None:
            self._reaper.join(5)
        for sw in self.switches.values():
            sw.stop()

    # -- called by the switch supervisors ------------------------------------------------

    def desired_jobs(self, switch: str) -> list[JobEntries]:
        """Every complete job with a pool on the switch, as that switch holds it: what its
        reconciliation installs (lock held)."""
        jobs = [j for j in self.jobs.values() if switch in j.switches and j.complete]
        return [self.entries_by_switch(j)[switch] for j in jobs]

    def entries_by_switch(self, job: Job) -> dict[str, JobEntries]:
        """What each of a complete job's switches holds for it, in write order (lock held)."""
        return job_entries(job, self.configs)

    def switch_synced(self, switch: str, job_ids: Sequence[int]) -> None:
        """The switch now holds these jobs (the reconciliation's; lock held)."""
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is not None and switch in job.switches:
                job.installed_on.add(switch)
        self.unread.discard(switch)
        self.changed.notify_all()

    def vet_stale_jobs(self, switch: str, job_ids: Sequence[int]) -> None:
        """Before the first reconciliation of `switch` writes anything: UnknownJobs (and the
        controller's refusal) when it holds jobs the database has no record of."""
        if switch not in self.unread or self.remove_unknown_jobs:
            return
        refusal = unknown_jobs_refusal(self.store, switch, job_ids)
        if refusal:
            log.error("%s", refusal)
            self.refusal = refusal
            self.refused.set()
            raise UnknownJobs(refusal)

    def job_ids_held(self, switch: str, job_ids: Sequence[int]) -> None:
        """The switch held entries of these unknown jobs: never hand their ids out again soon."""
        log.warning("switch %s held entries of unknown job(s) %s: removed", switch, list(job_ids))
        self.store.raise_next_job_id(job_ids)

    def switch_lost(self, switch: str) -> None:
        """The session ended: whether the entries survive is checked on reconnection (lock
        held)."""
        for job in self.jobs.values():
            job.installed_on.discard(switch)
        self.changed.notify_all()

    def settle(self, switch: str) -> None:
        """Remove the entries of the switch's ended jobs, then install its complete jobs that
        are not installed (the switch's io lock held, the manager's not)."""
        self.writes.settle(self.switches[switch])

    # -- worker API -------------------------------------------------------------------

    def create(
        self,
        name: str,
        world_size: int,
        codec: str,
        pool_size: int,
        switch: str = "",
        owner: str | None = None,
    ) -> tuple[Job, str]:
        """A new job and its token, written with `owner` (the operator creating it) in one
        transaction; its pool is allocated now when its switch is known."""
        check.check_name(name)
        check.check_world_size(world_size)
        check.check_codec(codec)
        pool_size = check.check_pool_size(pool_size, self.config.default_pool_size)
        if switch and switch not in self.switches:
            raise InvalidArgument(
                f"switch: no switch {switch!r} (configured: {', '.join(self.switches)})"
            )
        check_world_fits(self.configs, world_size, switch)
        token, token_hash = check.new_token()
        job = Job(0, name, token_hash, world_size, codec, pool_size, self.wall())
        target = switch or (next(iter(self.switches)) if len(self.switches) == 1 else "")
        with self.lock:
            if self.unread:
                raise Unavailable(
                    f"no job is created before switch(es) {', '.join(sorted(self.unread))} "
                    "were read back since the controller started (job ids they hold must not "
                    "come back); retry in a moment"
                )
            if target:
                place(self.jobs.values(), job, self.switches[target])
            try:
                self.store.create_job(job, owner, self.jobs)
            except OverflowError as exc:
                unplace(self.switches, job)
                raise ResourceExhausted(str(exc)) from None
            except BaseException:
                unplace(self.switches, job)
                raise
            job.idle_deadline = self.clock() + self.config.join_timeout
            self.jobs[job.job_id] = job
        log.info(
            "job %d (%s) created: %d ranks, %s, pool size %d%s",
            job.job_id,
            name,
            world_size,
            codec,
            pool_size,
            f", slots {job.pool_base}+{pool_size} on {job.switch}" if job.switch else "",
        )
        return job, token

    def join(
        self,
        job_id: int,
        token: str,
        rank: int,
        mac: str,
        ip: str,
        udp_port: int,
        switch_port: int | None = None,
    ) -> Job:
        """Register a rank; the join that completes the world installs the job (if the switch
        is up). switch_port None: the port the topology lists for the worker's IP."""
        rank, mac, ip = check.check_rank(rank), check.check_mac(mac), check.check_ip(ip)
        udp_port = check.check_udp_port(udp_port)
        if switch_port is not None:
            check.check_switch_port(switch_port)
        with self.lock:
            job = self._authorize(job_id, token)  # before the topology is consulted
            if switch_port is None:
                switch_port = attached_port(self.switches, ip)
            new = JobWorker(rank, mac, ip, udp_port, switch_port)
            check.check_rank(rank, job.world_size)
            old = job.workers.get(rank)
            if old is not None:
                if old.same_endpoint(new) and not old.left:
                    self._renew(job, old)  # a retried join
                    return job
                raise AlreadyExists(
                    f"rank {rank} of job {job_id} already joined from {old.ip}:{old.udp_port} "
                    f"({old.mac}, switch port {old.switch_port})"
                )
            self._add_rank(job, new)
            log.info(
                "job %d: rank %d joined from %s:%d (port %d), %d of %d",
                job_id,
                rank,
                ip,
                udp_port,
                switch_port,
                len(job.workers),
                job.world_size,
            )
            self.changed.notify_all()
            if not job.complete:
                return job
        try:
            self.writes.install(job)
        except Unavailable as exc:  # the join stands; the supervisor installs on reconnection
            log.warning("job %d: %s", job_id, exc)
        return job

    def _add_rank(self, job: Job, worker: JobWorker) -> None:
        """Record a joined rank (its endpoint free, the job placed on its switch with its first
        rank, within its port's buffer: placement.admit), persisted first."""
        before = max(1, len(job.switches))
        undo = admit(self.switches, list(self.jobs.values()), job, worker)
        extra = (len(job.switches) - before) * job.pool_size
        if extra > 0 and self.slot_quota is not None:
            try:
                self.slot_quota(job, extra)
            except BaseException:
                undo()
                raise
        job.workers[worker.rank] = worker
        try:
            self.store.save_job(job)
        except BaseException:
            del job.workers[worker.rank]
            undo()
            raise
        self._renew(job, worker)

    def wait_ready(
        self,
        job_id: int,
        token: str,
        rank: int,
        timeout: float,
        is_active: Callable[[], bool] = lambda: True,
    ) -> Assignment:
        """Block until the job is installed; waiting keeps the rank's lease alive. At the timeout:
        DeadlineExceeded while ranks are missing, Unavailable while the switch is unreachable."""
        timeout = check.check_timeout(timeout)
        deadline = self.clock() + timeout
        with self.lock:
            while True:
                job = self._authorize(job_id, token)
                worker = self._live_rank(job, rank)
                self._renew(job, worker)
                if job.installed:  # else the join or the switch's supervisor installs it
                    return self._assignment(job, rank)
                remaining = deadline - self.clock()
                if remaining <= 0 or not is_active() or self._stop.is_set():
                    if job.complete:
                        waiting = [n for n in job.switches if n not in job.installed_on]
                        for name in waiting:
                            self.switches[name].require()  # Unavailable, saying why
                        raise Unavailable(f"job {job_id} is not installed yet: {waiting} syncing")
                    missing = [r for r in range(job.world_size) if r not in job.workers]
                    raise DeadlineExceeded(
                        f"job {job_id}: {len(job.workers)} of {job.world_size} ranks joined "
                        f"within {timeout:g} s (missing ranks {missing})"
                    )
                self.changed.wait(min(remaining, self.config.lease / 4))

    def wake(self) -> None:
        """Wake every waiting WaitReady (one was superseded or its client went away)."""
        with self.lock:
            self.changed.notify_all()

    def heartbeat(
        self, job_id: int, token: str, rank: int, gave_up: GaveUp | None = None
    ) -> tuple[JobState, GaveUp | None]:
        """Renew the rank's lease and record its give-up; returns the job's state and the
        give-up of the newest call any rank told (for the others to stop waiting for it)."""
        with self.lock:
            job = self._authorize(job_id, token)
            self._renew(job, self._live_rank(job, rank))
            if gave_up is not None and job.tell(gave_up):
                log.info("job %d: %s", job_id, gave_up)
            return job.state, job.gave_up

    def leave(self, job_id: int, token: str, rank: int) -> bool:
        """The rank is done (before the job is complete: it un-joins); True when the job ended."""
        with self.lock:
            job = self._authorize(job_id, token)
            check.check_rank(rank, job.world_size)
            worker = job.workers.get(rank)
            if worker is None:
                raise FailedPrecondition(f"rank {rank} has not joined job {job_id}")
            if job.complete and worker.left:
                return False
            was_complete = job.complete
            if was_complete:
                worker.left = True
            else:
                del job.workers[rank]
            try:
                self.store.save_job(job)
            except BaseException:
                worker.left = False
                job.workers[rank] = worker
                raise
            log.info("job %d: rank %d left", job_id, rank)
            ended = was_complete and not job.live_ranks()
            if ended:
                self.end_job(job, "every rank left")
            self.changed.notify_all()
        if ended:
            self.writes.remove_now(job)
        return ended

    # -- operator API -----------------------------------------------------------------

    def release(self, job_id: int) -> Job:
        """End a running job now (operator): entries removed, pools freed. Unavailable unless
        its entries are known to be gone from its switches (the job keeps running; a tree's
        switches it was removed from re-install it)."""
        reason = "released by the operator"
        with self.lock:
            job = self._running(job_id)
            if job.switch is None or not job.complete:
                self.end_job(job, reason)  # nothing of it is on a switch
                return job
        self.writes.release(job, lambda: self._running(job_id), reason)
        return job

    def _running(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            ended = self.store.job(job_id) if 1 <= job_id <= MAX_JOB_ID else None
            if ended is None:
                raise self._unknown(job_id)
            raise FailedPrecondition(f"job {job_id} has already ended: {ended.end_reason}")
        return job

    def list_jobs(self, include_ended: bool = False) -> list[Job]:
        """Running jobs by id, then (optionally) the most recently ended ones."""
        with self.lock:
            jobs = [self.jobs[j] for j in sorted(self.jobs)]
        ended = self.store.ended_jobs() if include_ended else []
        for job in ended:
            locate_workers(job, self.configs)  # their switches, as far as the topology tells
        return jobs + ended

    def lease_remaining(self, worker: JobWorker) -> float:
        """Seconds left on a rank's lease (-1 once it left)."""
        return -1.0 if worker.left else max(0.0, worker.deadline - self.clock())

    # -- internals (lock held) ---------------------------------------------------------

    def _unknown(self, job_id: int) -> ControllerError:
        """NOT_FOUND; but UNAVAILABLE while a switch has not been read back since the start
        (or was refused): the job may run on it, lost by this database, and NOT_FOUND would
        make its workers give it up for good."""
        if self.refusal:
            return Unavailable(f"no job {job_id} here: the controller refuses to start")
        if self.unread:
            waiting = ", ".join(sorted(self.unread))
            return Unavailable(
                f"no job {job_id} known yet: switch(es) {waiting} not read back since the "
                "controller started; retry"
            )
        return NotFound(f"no job {job_id}")

    def _authorize(self, job_id: int, token: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            ended = self.store.job(job_id) if 1 <= job_id <= MAX_JOB_ID else None
            if ended is None:
                raise self._unknown(job_id)
            if not check.token_matches(token, ended.token_hash):
                raise Unauthenticated(f"wrong token for job {job_id}")
            raise FailedPrecondition(f"job {job_id} has ended: {ended.end_reason}")
        if not check.token_matches(token, job.token_hash):
            raise Unauthenticated(f"wrong token for job {job_id}")
        return job

    def _live_rank(self, job: Job, rank: int) -> JobWorker:
        check.check_rank(rank, job.world_size)
        worker = job.workers.get(rank)
        if worker is None:
            raise FailedPrecondition(
                f"rank {rank} has not joined job {job.job_id}; call JoinJob first"
            )
        if worker.left:
            raise FailedPrecondition(f"rank {rank} has left job {job.job_id}")
        return worker

    def _renew(self, job: Job, worker: JobWorker) -> None:
        now = self.clock()
        worker.deadline = now + self.config.lease
        job.idle_deadline = now + self.config.join_timeout

    def end_job(self, job: Job, reason: str, on_switch: bool = True) -> None:
        """Free the job's pool and record why it ended (lock held). on_switch: its entries
        may be on the switch; their removal is queued ahead of every later write there (the
        caller or the switch's supervisor performs it outside the lock)."""
        removals = self.entries_by_switch(job) if on_switch and job.complete else {}
        for name, base in reversed(job.pools.items()):  # the leaves first, as removed
            sw = self.switches[name]
            if name in removals:
                sw.pending_removals[job.job_id] = removals[name]
                sw.kick()
            sw.pools.release(base)
        job.ended, job.end_reason = self.wall(), reason
        job.installed_on.clear()
        del self.jobs[job.job_id]
        try:
            self.store.save_job(job)
        except Exception:  # the in-memory view is already right; a restart may resurrect it briefly
            log.exception("job %d: could not record its end", job.job_id)
        log.info("job %d (%s) ended: %s", job.job_id, job.name, reason)
        self.changed.notify_all()

    def _assignment(self, job: Job, rank: int) -> Assignment:
        """The rank's assignment: its own switch's (a tree job's: its leaf's) addresses."""
        assert job.switch is not None
        sw = self.configs[job.workers[rank].switch or job.switch]
        return Assignment(
            job.job_id,
            rank,
            job.world_size,
            sw.name,
            sw.service_ip,
            AGG_UDP_PORT,
            sw.mac,
            job.pool_size,
            sw.cells_per_packet,
            job.codec,
            self.config.heartbeat_interval,
            self.config.lease,
            sw.lane_ops,
        )

    def _reap_loop(self) -> None:
        interval = reap_interval(self.config.lease)
        while not self._stop.wait(interval):
            try:
                self.expire_due()
            except Exception:
                log.exception("lease check failed")

    def expire_due(self) -> list[int]:
        """End every job whose lease ran out; returns their ids."""
        with self.lock:
            due = expired(list(self.jobs.values()), self.clock(), self.config)
            for job, reason in due:
                self.end_job(job, reason)
            self.lease_expiries += len(due)
        return [job.job_id for job, _ in due]
