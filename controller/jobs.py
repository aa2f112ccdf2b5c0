"""The job lifecycle across the configured switches: create (pool allocated as soon as the
switch is known), join (the join completing the world installs the job), wait, heartbeat
leases, leave, release, and expiry. State changes are persisted before they are applied to
a switch; a failing request changes nothing. One lock guards the jobs, the pools and the
switch sessions (docs/controller.md describes the rules)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from aggwire.constants import AGG_UDP_PORT, CELLS_PER_PKT, MAX_JOB_ID
from controller import validation as check
from controller.aggregation import JobEntries
from controller.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from controller.config import ControllerConfig
from controller.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from controller.model import Assignment, Job, JobState, JobWorker
from controller.pools import PoolExhausted
from controller.store import Store
from controller.switches import ManagedSwitch, SwitchRejected
from p4rtproto.bytestrings import mac_to_int

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
    ) -> None:
        self.config, self.store = config, store
        self.clock, self.wall = clock, wall
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on every job state change
        self.switches = {
            s.name: ManagedSwitch(s, self.lock, self, artifacts, poll_interval, max_backoff)
            for s in config.switches
        }
        self.jobs: dict[int, Job] = {}
        self.started = wall()
        # After --fresh-database no job is created before every switch was read back: its
        # job ids must not come back (Store.raise_next_job_id).
        self.unread = set(self.switches) if store.set_aside is not None else set()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._restore()

    # -- lifecycle of the manager ---------------------------------------------------------

    def _restore(self) -> None:
        now = self.clock()
        for job in self.store.active_jobs():
            sw = self.switches.get(job.switch) if job.switch else None
            problem = ""
            if job.switch and sw is None:
                problem = f"switch {job.switch} is no longer configured"
            elif sw is not None and job.pool_base is not None:
                try:
                    sw.pools.reserve(job.pool_base, job.pool_size)
                except ValueError as exc:
                    problem = f"its pool could not be restored: {exc}"
            if problem:
                log.warning("job %d ended on restart: %s", job.job_id, problem)
                job.ended, job.end_reason = self.wall(), problem
                self.store.save_job(job)
                continue
            for w in job.live_ranks():
                w.deadline = now + self.config.lease  # a grace period: workers heartbeat again
            job.idle_deadline = now + self.config.join_timeout
            self.jobs[job.job_id] = job
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

    # -- called by the switch supervisors (lock held) -----------------------------------

    def desired_jobs(self, switch: str) -> list[JobEntries]:
        """Every complete job of the switch: what its reconciliation installs."""
        return [j.entries() for j in self.jobs.values() if j.switch == switch and j.complete]

    def switch_synced(self, switch: str) -> None:
        """The switch now holds every complete job of it."""
        for job in self.jobs.values():
            if job.switch == switch and job.complete:
                job.installed = True
        self.unread.discard(switch)
        self.changed.notify_all()

    def job_ids_held(self, switch: str, job_ids: Sequence[int]) -> None:
        """The switch held entries of these unknown jobs: never hand their ids out again soon."""
        log.warning("switch %s held entries of unknown job(s) %s: removed", switch, list(job_ids))
        self.store.raise_next_job_id(job_ids)

    def switch_lost(self, switch: str) -> None:
        """The session ended: whether the entries survive is checked on reconnection."""
        for job in self.jobs.values():
            if job.switch == switch:
                job.installed = False
        self.changed.notify_all()

    # -- worker API -------------------------------------------------------------------

    def create(
        self, name: str, world_size: int, codec: str, pool_size: int, switch: str = ""
    ) -> tuple[Job, str]:
        """A new job and its token; its pool is allocated now when its switch is known."""
        check.check_name(name)
        check.check_world_size(world_size)
        check.check_codec(codec)
        pool_size = check.check_pool_size(pool_size, self.config.default_pool_size)
        if switch and switch not in self.switches:
            raise InvalidArgument(
                f"switch: no switch {switch!r} (configured: {', '.join(self.switches)})"
            )
        if self.unread:
            raise Unavailable(
                f"the database was started fresh: no job is created before switch(es) "
                f"{', '.join(sorted(self.unread))} were read back; retry in a moment"
            )
        token, token_hash = check.new_token()
        job = Job(0, name, token_hash, world_size, codec, pool_size, self.wall())
        target = switch or (next(iter(self.switches)) if len(self.switches) == 1 else "")
        with self.lock:
            if target:
                self._place(job, self.switches[target])
            try:
                job.job_id = self.store.take_job_id(self.jobs)
                self.store.save_job(job)
            except OverflowError as exc:
                self._unplace(job)
                raise ResourceExhausted(str(exc)) from None
            except BaseException:
                self._unplace(job)
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
                switch_port = self._attached_port(ip)
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
            clash = next(
                (w for w in job.workers.values() if (w.ip, w.udp_port) == (new.ip, new.udp_port)),
                None,
            )
            if clash is not None:
                raise AlreadyExists(
                    f"rank {clash.rank} of job {job_id} already receives at {ip}:{udp_port}"
                )
            sw = self._switch_for(job, new)
            placed = job.switch is None
            if placed:
                self._place(job, sw)
            job.workers[rank] = new
            try:
                self.store.save_job(job)
            except BaseException:
                del job.workers[rank]
                if placed:
                    self._unplace(job)
                raise
            self._renew(job, new)
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
            if job.complete:
                try:
                    self._try_install(job)
                except (
                    Unavailable
                ) as exc:  # the join stands; the supervisor installs on reconnection
                    log.warning("job %d: %s", job_id, exc)
            self.changed.notify_all()
            return job

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
                if job.complete and not job.installed:
                    # the supervisor installs it once the switch is back
                    with contextlib.suppress(Unavailable):
                        self._try_install(job)
                if job.installed:
                    return self._assignment(job, rank)
                remaining = deadline - self.clock()
                if remaining <= 0 or not is_active() or self._stop.is_set():
                    if job.complete:
                        assert job.switch is not None
                        self.switches[job.switch].require()  # Unavailable, saying why
                        raise Unavailable(
                            f"job {job_id} is not installed yet: switch {job.switch} is syncing"
                        )
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

    def heartbeat(self, job_id: int, token: str, rank: int) -> JobState:
        """Renew the rank's lease; returns the job's state."""
        with self.lock:
            job = self._authorize(job_id, token)
            self._renew(job, self._live_rank(job, rank))
            return job.state

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
            if was_complete and not job.live_ranks():
                self._end(job, "every rank left")
                return True
            self.changed.notify_all()
            return False

    # -- operator API -----------------------------------------------------------------

    def release(self, job_id: int) -> Job:
        """End a running job now (operator): entries removed, pool freed."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                ended = self.store.job(job_id) if 1 <= job_id <= MAX_JOB_ID else None
                if ended is None:
                    raise NotFound(f"no job {job_id}")
                raise FailedPrecondition(f"job {job_id} has already ended: {ended.end_reason}")
            self._end(job, "released by the operator", strict=True)
            return job

    def list_jobs(self, include_ended: bool = False) -> list[Job]:
        """Running jobs by id, then (optionally) the most recently ended ones."""
        with self.lock:
            jobs = [self.jobs[j] for j in sorted(self.jobs)]
        return jobs + (self.store.ended_jobs() if include_ended else [])

    def lease_remaining(self, worker: JobWorker) -> float:
        """Seconds left on a rank's lease (-1 once it left)."""
        return -1.0 if worker.left else max(0.0, worker.deadline - self.clock())

    # -- internals (lock held) ---------------------------------------------------------

    def _authorize(self, job_id: int, token: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            ended = self.store.job(job_id) if 1 <= job_id <= MAX_JOB_ID else None
            if ended is None:
                raise NotFound(f"no job {job_id}")
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

    def _attached_port(self, ip: str) -> int:
        """The switch port a host is attached to, per the configured topology."""
        for sw in self.switches.values():
            host = sw.config.host_by_ip(ip)
            if host is not None:
                return host.switch_port
        raise InvalidArgument(
            f"{ip} is not a host of any configured switch, so its switch port is unknown: "
            "add the host to the controller's configuration or pass the switch port"
        )

    def _switch_for(self, job: Job, worker: JobWorker) -> ManagedSwitch:
        """The switch the worker is on; a known host must match the topology."""
        for sw in self.switches.values():
            host = sw.config.host_by_ip(worker.ip)
            if host is None:
                continue
            if (
                mac_to_int(host.mac) != mac_to_int(worker.mac)
                or host.switch_port != worker.switch_port
            ):
                raise InvalidArgument(
                    f"per the topology {worker.ip} is {host.mac} on port "
                    f"{host.switch_port} of switch "
                    f"{sw.name}, not {worker.mac} on port {worker.switch_port}"
                )
            if job.switch is not None and job.switch != sw.name:
                raise FailedPrecondition(
                    f"job {job.job_id} runs on switch {job.switch} but {worker.ip} is attached "
                    f"to {sw.name}: jobs spanning several switches are not supported"
                )
            return sw
        if job.switch is not None:
            return self.switches[job.switch]
        if len(self.switches) == 1:
            return next(iter(self.switches.values()))
        raise InvalidArgument(
            f"{worker.ip} is not a host of any configured switch, so the job's switch "
            f"cannot be chosen: name the switch in CreateJob"
        )

    def _place(self, job: Job, sw: ManagedSwitch) -> None:
        """Allocate the job's pool on the switch (within its job and worker table sizes)."""
        there = [j for j in self.jobs.values() if j.switch == sw.name]
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
        try:
            job.pool_base = sw.pools.allocate(job.pool_size)
        except PoolExhausted as exc:
            raise PoolExhausted(f"switch {sw.name}: {exc}") from None
        job.switch = sw.name

    def _unplace(self, job: Job) -> None:
        if job.switch is not None and job.pool_base is not None:
            self.switches[job.switch].pools.release(job.pool_base)
        job.switch = job.pool_base = None

    def _try_install(self, job: Job) -> None:
        """Install a complete job if its switch is up (else its supervisor will, on reconnection);
        Unavailable if the link fails during the install, FailedPrecondition if the switch
        refuses."""
        assert job.switch is not None
        sw = self.switches[job.switch]
        if not sw.connected:
            return
        try:
            sw.install(job.entries())
        except SwitchRejected as exc:
            reason = f"switch {sw.name} rejected its entries: {exc}"
            self._end(job, reason)
            raise FailedPrecondition(f"job {job.job_id} ended: {reason}") from None
        job.installed = True
        log.info(
            "job %d installed on %s: slots %d..%d, %d ranks",
            job.job_id,
            sw.name,
            job.pool_base,
            (job.pool_base or 0) + job.pool_size - 1,
            job.world_size,
        )
        self.changed.notify_all()

    def _end(self, job: Job, reason: str, strict: bool = False) -> None:
        """Remove the job's entries, free its pool and record why it ended. strict: the
        entries must be gone from the switch now, else Unavailable and the job keeps running
        (a release must not report success while the switch still holds the job)."""
        if job.switch is not None and job.complete:
            self.switches[job.switch].remove(job.entries(), strict=strict)
        if job.switch is not None and job.pool_base is not None:
            self.switches[job.switch].pools.release(job.pool_base)
        job.ended, job.end_reason, job.installed = self.wall(), reason, False
        del self.jobs[job.job_id]
        try:
            self.store.save_job(job)
        except Exception:  # the in-memory view is already right; a restart may resurrect it briefly
            log.exception("job %d: could not record its end", job.job_id)
        log.info("job %d (%s) ended: %s", job.job_id, job.name, reason)
        self.changed.notify_all()

    def _assignment(self, job: Job, rank: int) -> Assignment:
        assert job.switch is not None
        sw = self.switches[job.switch].config
        return Assignment(
            job.job_id,
            rank,
            job.world_size,
            sw.name,
            sw.service_ip,
            AGG_UDP_PORT,
            sw.mac,
            job.pool_size,
            CELLS_PER_PKT,
            job.codec,
            self.config.heartbeat_interval,
            self.config.lease,
            sw.lane_ops,
        )

    def _reap_loop(self) -> None:
        interval = min(0.5, self.config.lease / 4)
        while not self._stop.wait(interval):
            try:
                self.expire_due()
            except Exception:
                log.exception("lease check failed")

    def expire_due(self) -> list[int]:
        """End every job whose lease ran out; returns their ids."""
        ended = []
        with self.lock:
            now = self.clock()
            for job in list(self.jobs.values()):
                live = job.live_ranks()
                late = [w.rank for w in live if w.deadline < now]
                if late:
                    ranks = (
                        f"rank {late[0]}"
                        if len(late) == 1
                        else f"ranks {', '.join(map(str, late))}"
                    )
                    self._end(
                        job, f"lease of {ranks} expired (no heartbeat for {self.config.lease:g} s)"
                    )
                elif not live and job.idle_deadline < now:
                    self._end(job, f"no live rank for {self.config.join_timeout:g} s")
                else:
                    continue
                ended.append(job.job_id)
        return ended
