"""One managed switch: its P4Runtime session, a supervisor thread that reconnects with
backoff after the switch (or the link) goes away, and the reconciliation that makes the
switch hold exactly what it should: the pipeline (pushed only when missing or different,
since a push resets the slots of running jobs), the forwarding entries of the topology and
the entries of every job placed on it. Entries are written through homagg/control/install.py
(one order for every writer); job installs roll back.

Two locks: the job manager's (jobs, pools, leases and this switch's bookkeeping) is never
held during P4Runtime calls, so heartbeats, Status and operator reads never wait on a slow
switch; the switch's own `io` lock orders every write sequence on it (reconciliation,
installs, removals). Lock order: `io` first, then the manager's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import grpc

from homagg.api.errors import Unavailable
from homagg.control.aggregation import JobEntries
from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.config import SwitchConfig
from homagg.control.entries import EntrySpec, Spec
from homagg.control.forwarding import forwarding_entries
from homagg.control.install import InstallError, install_job, job_specs, reconcile, remove_job
from homagg.control.pools import SlotAllocator
from homagg.control.switch_connection import SwitchConnection, SwitchError
from homagg.control.tree import peer_services, transit_hosts
from homagg.p4rt.p4info import P4InfoIndex
from homagg.wire import p4names

log = logging.getLogger(__name__)
LINK_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    None,
)


class SwitchRejected(Exception):
    """The switch refused updates for a reason other than connectivity (full table, bad
    value...)."""


class UnknownJobs(Exception):
    """The switch holds job entries the database has no record of: the controller refuses
    to manage it (and to start) rather than remove running jobs (homagg/control/jobs.py)."""


class SwitchListener(Protocol):
    """What a ManagedSwitch asks of the job manager. desired_jobs, switch_synced and
    switch_lost are called with the manager's lock held; settle with the switch's io lock
    held and the manager's not."""

    def desired_jobs(self, switch: str) -> list[JobEntries]: ...

    def switch_synced(self, switch: str, job_ids: Sequence[int]) -> None: ...

    def switch_lost(self, switch: str) -> None: ...

    def job_ids_held(self, switch: str, job_ids: Sequence[int]) -> None: ...

    def vet_stale_jobs(self, switch: str, job_ids: Sequence[int]) -> None: ...

    def settle(self, switch: str) -> None: ...


def _same_program(a: P4InfoIndex, b: P4InfoIndex) -> bool:
    """True when two P4Infos describe the same program (pkg_info, e.g. build notes, ignored)."""
    pa, pb = type(a.proto)(), type(b.proto)()
    pa.CopyFrom(a.proto)
    pb.CopyFrom(b.proto)
    pa.ClearField("pkg_info")
    pb.ClearField("pkg_info")
    return pa == pb


class ManagedSwitch:
    """A configured switch kept in sync by its supervisor thread; owns the switch's slot pools."""

    def __init__(
        self,
        config: SwitchConfig,
        lock: threading.RLock,
        listener: SwitchListener,
        artifacts: tuple[Path, Path] = (P4INFO_PATH, BMV2_JSON_PATH),
        poll_interval: float = 0.2,
        max_backoff: float = 5.0,
        topology: Mapping[str, SwitchConfig] | None = None,
    ) -> None:
        self.config = config
        # the hosts behind the other switches of its tree (`topology`: every configured switch)
        self.transit = transit_hosts(topology, config.name) if topology else []
        self.peers = peer_services(topology, config.name) if topology else []
        self.name = config.name
        self.lock = lock  # the job manager's: state only, never held during P4Runtime calls
        self.io = threading.Lock()  # orders every write sequence on this switch
        # Entries of ended jobs not yet removed (under `lock`): removed before anything else
        # is written (a new job may reuse their slots), or by the next reconciliation.
        self.pending_removals: dict[int, JobEntries] = {}
        self.epoch = 0  # (under `lock`) counts losses of trust: a write begun before is stale
        self.listener = listener
        if config.p4info is not None and config.device_config is not None:
            artifacts = (config.p4info, config.device_config)  # its own program (Tofino)
        self.artifacts = artifacts
        self.p4info = P4InfoIndex.from_text_file(artifacts[0])
        self.pools = SlotAllocator()
        self.max_jobs = self.p4info.table(p4names.JOB_TABLE).size
        self.max_workers = self.p4info.table(p4names.WORKER_TABLE).size
        self.conn: SwitchConnection | None = None
        self.last_error = ""
        self.connects = 0
        self.pipeline_pushes = 0
        self.reconciliations = 0  # read-backs (or pushes) that made the switch hold its state
        self.needs_sync = False  # a removal failed: re-run the reconciliation
        # The session is trusted only while it is primary and has been reconciled since it
        # last became primary: another primary may have changed any entry meanwhile.
        self.synced = False
        self._losses_at_sync = 0
        self.poll_interval, self.max_backoff = poll_interval, max_backoff
        self._stop = threading.Event()
        self._work = threading.Event()  # kick(): something to settle
        self._thread: threading.Thread | None = None

    @property
    def connected(self) -> bool:
        """True while the session is open and primary, and the switch has been reconciled
        since the controller last became primary."""
        conn = self.conn
        return (
            conn is not None
            and conn.is_connected
            and conn.is_primary
            and self.synced
            and conn.primary_losses == self._losses_at_sync
        )

    @property
    def role(self) -> str:
        """The controller's P4Runtime role on the switch: primary, backup (naming the
        primary's election id) or none (no session)."""
        conn = self.conn
        if conn is None or not conn.is_connected:
            return "none"
        if conn.is_primary:
            return "primary"
        return f"backup (election id {conn.primary_election_id} is primary)"

    def require(self) -> SwitchConnection:
        """The open, primary and reconciled session, or Unavailable saying why not."""
        conn = self.conn
        if conn is None or not conn.is_connected:
            detail = f": {self.last_error}" if self.last_error else ""
            raise Unavailable(f"switch {self.name} ({self.config.address}) is unreachable{detail}")
        if not conn.is_primary:
            raise Unavailable(f"switch {self.name}: {self._not_primary_reason(conn)}")
        if not self.connected:
            raise Unavailable(f"switch {self.name} is being reconciled; retry in a moment")
        return conn

    def _not_primary_reason(self, conn: SwitchConnection) -> str:
        return (
            f"the controller is not primary (a client with election id "
            f"{conn.primary_election_id} is, the controller has {self.config.election_id}); "
            f"nothing is written until it is primary again and has read the switch back"
        )

    # -- supervisor -------------------------------------------------------------------

    def start(self) -> None:
        """Start the supervisor thread (it connects in the background)."""
        self._thread = threading.Thread(target=self._run, name=f"switch-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the supervisor and close the session (the switch keeps its entries)."""
        self._stop.set()
        self._work.set()
        if self._thread is not None:
            self._thread.join(self.config.timeout + 2)
        self._drop(notify=False)

    def kick(self) -> None:
        """Ask the supervisor to settle now (removals pending, a job to install)."""
        self._work.set()

    def _run(self) -> None:
        backoff = self.poll_interval
        while not self._stop.is_set():
            if self.connected and not self.needs_sync:
                self._work.clear()
                # never queue behind a long write: what is left is settled at the next poll
                if self.io.acquire(timeout=self.poll_interval):
                    try:
                        self._settle()
                    finally:
                        self.io.release()
                self._work.wait(self.poll_interval)
                continue
            conn = self.conn
            if conn is not None and conn.is_connected and not conn.is_primary:
                self._backup(conn)
                self._stop.wait(self.poll_interval)
                continue
            if self.conn is not None and not self.conn.is_connected:
                log.warning(
                    "switch %s: P4Runtime session lost (%s); reconnecting",
                    self.name,
                    self.conn.stream_error,
                )
                self.last_error = self.conn.stream_error or "session lost"
                self._drop()
            try:
                self._sync()
                backoff = self.poll_interval
            except UnknownJobs as exc:  # nothing was written: the switch is left as it is
                self.last_error = str(exc)
                self._drop()
                return
            except Exception as exc:  # the supervisor must outlive any failure
                self.last_error = str(exc)
                if isinstance(exc, (SwitchError, SwitchRejected)):
                    log.warning("switch %s: %s (retrying in %.1f s)", self.name, exc, backoff)
                else:
                    log.exception(
                        "switch %s: synchronisation failed (retrying in %.1f s)", self.name, backoff
                    )
                self._drop()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    def _settle(self) -> None:
        """Remove ended jobs' entries and install completed jobs (io lock held)."""
        try:
            self.listener.settle(self.name)
        except Exception:  # the session stays: only this round of writes failed
            log.exception("switch %s: settling failed", self.name)

    def _drop(self, notify: bool = True) -> None:
        """Forget the session (its jobs are no longer known to be installed), then close it
        outside the manager's lock."""
        with self.lock:
            conn, self.conn, self.synced = self.conn, None, False
            if conn is not None:
                self.epoch += 1
                if notify:
                    self.listener.switch_lost(self.name)
        if conn is not None:
            conn.close()

    def _backup(self, conn: SwitchConnection) -> None:
        """Another client is primary: the session stays open as a backup (the switch tells it
        when primary comes back), jobs show installing and nothing is written."""
        reason = self._not_primary_reason(conn)
        if reason != self.last_error:
            log.warning("switch %s: %s", self.name, reason)
            self.last_error = reason
        if self.synced:
            with self.lock:
                self.synced, self.needs_sync = False, True
                self.epoch += 1
                self.listener.switch_lost(self.name)

    def _sync(self) -> None:
        conn, fresh = self.conn, self.conn is None
        if conn is None:
            conn = SwitchConnection(
                self.config.address,
                self.config.device_id,
                self.config.election_id,
                self.config.timeout,
            )
            conn.connect(require_primary=False)
            if not conn.is_primary:
                with self.lock:
                    self.conn = conn
                    self.connects += 1
                self._backup(conn)
                return
        with self.io:
            losses = conn.primary_losses
            with self.lock:
                jobs = self.listener.desired_jobs(self.name)
                # the reconciliation removes whatever no desired job needs
                self.pending_removals.clear()
            try:
                # never from memory alone: the tables are read back (unless freshly pushed)
                self.reconcile(conn, jobs)
                if conn.primary_losses != losses or not conn.is_primary:
                    raise SwitchError("lost primary during the reconciliation")
            except BaseException:
                if fresh:
                    conn.close()
                raise
            with self.lock:
                self.conn, self.needs_sync, self.last_error = conn, False, ""
                self.synced, self._losses_at_sync = True, losses
                self.connects += int(fresh)
                self.listener.switch_synced(self.name, [j.job_id for j in jobs])
            self._settle()  # what ended or completed meanwhile

    # -- reconciliation -------------------------------------------------------------------

    def ensure_pipeline(self, conn: SwitchConnection) -> bool:
        """Push the pipeline unless the switch already runs this program; True when pushed."""
        try:
            if _same_program(conn.get_p4info(), self.p4info):
                return False
            reason = "runs another program"
        except SwitchError as exc:
            if exc.code in LINK_CODES:
                raise
            reason = "has no pipeline"
        log.info("switch %s %s: pushing the pipeline", self.name, reason)
        conn.set_pipeline(*self.artifacts)
        self.pipeline_pushes += 1
        return True

    def forwarding_entries(self) -> list[EntrySpec]:
        """Proxy ARP and routes for the configured hosts (also those behind the other switches
        of its tree), the aggregation service address and the service source addresses."""
        c = self.config
        return forwarding_entries(c.hosts, c.service_ip, c.mac, self.transit, self.peers)

    def reconcile(self, conn: SwitchConnection, jobs: Sequence[JobEntries]) -> str:
        """Make the switch hold exactly the forwarding entries and these jobs; returns a summary."""
        pushed = self.ensure_pipeline(conn)
        desired: list[Spec] = [
            *self.forwarding_entries(),
            *(s for job in jobs for s in job_specs(job)),
        ]
        done = reconcile(
            conn,
            desired,
            read_back=not pushed,
            vet=lambda ids: self.listener.vet_stale_jobs(self.name, ids),
        )
        self.reconciliations += 1
        if done.stale_job_ids:
            self.listener.job_ids_held(self.name, done.stale_job_ids)
        summary = (
            f"pipeline {'pushed' if pushed else 'kept'}, {done.installed} entries "
            f"installed, {done.modified} modified, {done.removed} removed, {len(jobs)} jobs"
        )
        log.info("switch %s synced: %s", self.name, summary)
        return summary

    # -- jobs -----------------------------------------------------------------------------

    def install(self, job: JobEntries) -> None:
        """Install a job (homagg/control/install.py); on failure what was written is removed and
        Unavailable (link) or SwitchRejected is raised. An entry already there is overwritten."""
        conn = self.require()
        try:
            install_job(conn, job)
        except InstallError as exc:
            if exc.leftovers:
                self.needs_sync = True  # leftovers are removed by the next reconciliation
            if exc.code in LINK_CODES or not conn.is_connected:
                raise Unavailable(
                    f"switch {self.name} became unreachable while installing job "
                    f"{job.job_id}: {exc}"
                ) from None
            if exc.code == grpc.StatusCode.PERMISSION_DENIED or not self.connected:
                self.needs_sync = True  # another client became primary: reconcile when back
                raise Unavailable(
                    f"switch {self.name}: lost primary while installing job {job.job_id}: {exc}"
                ) from None
            raise SwitchRejected(str(exc)) from None

    def remove(self, job: JobEntries, strict: bool = False) -> bool:
        """Delete a job's entries, job entry first; missing ones are fine. True when every
        entry is known to be gone. Unreachable or not primary: nothing to do now, the next
        reconciliation removes them. strict=True: raise Unavailable instead of returning
        False."""
        if strict:
            conn = self.require()
        elif self.connected:
            conn = self.conn  # type: ignore[assignment]
        else:
            return False
        problems = remove_job(conn, job)
        for exc in problems:
            log.warning("switch %s: removing job %d: %s", self.name, job.job_id, exc)
            self.needs_sync = True
        if strict and problems:
            raise Unavailable(
                f"switch {self.name} did not remove job {job.job_id}'s entries "
                f"({problems[0]}); the job keeps running and the switch is reconciled: retry"
            )
        return not problems
