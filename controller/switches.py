"""One managed switch: its P4Runtime session, a supervisor thread that reconnects with
backoff after the switch (or the link) goes away, and the reconciliation that makes the
switch hold exactly what it should: the pipeline (pushed only when missing or different,
since a push resets the slots of running jobs), the forwarding entries of the topology and
the entries of every job placed on it. Job installs write in stages and roll back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import grpc

from aggwire import p4names
from controller.aggregation import JobEntries, job_entries, job_group
from controller.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from controller.config import SwitchConfig
from controller.entries import EntrySpec
from controller.errors import Unavailable
from controller.forwarding import host_entries, service_entries
from controller.pools import SlotAllocator
from controller.switch_connection import P4RuntimeWriteError, SwitchConnection, SwitchError, WriteBatch
from p4rtproto.api import p4runtime_pb2
from p4rtproto.p4info import P4InfoIndex

log = logging.getLogger(__name__)
Update = p4runtime_pb2.Update
LINK_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, None)


class SwitchRejected(Exception):
    """The switch refused updates for a reason other than connectivity (full table, bad value...)."""


class SwitchListener(Protocol):
    """What a ManagedSwitch asks of the job manager (called with the shared lock held)."""

    def desired_jobs(self, switch: str) -> list[JobEntries]: ...

    def switch_synced(self, switch: str) -> None: ...

    def switch_lost(self, switch: str) -> None: ...


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

    def __init__(self, config: SwitchConfig, lock: threading.RLock, listener: SwitchListener,
                 artifacts: tuple[Path, Path] = (P4INFO_PATH, BMV2_JSON_PATH),
                 poll_interval: float = 0.2, max_backoff: float = 5.0) -> None:
        self.config = config
        self.name = config.name
        self.lock = lock
        self.listener = listener
        self.artifacts = artifacts
        self.p4info = P4InfoIndex.from_text_file(artifacts[0])
        self.pools = SlotAllocator()
        self.max_jobs = self.p4info.table(p4names.JOB_TABLE).size
        self.max_workers = self.p4info.table(p4names.WORKER_TABLE).size
        self.conn: SwitchConnection | None = None
        self.last_error = ""
        self.connects = 0
        self.pipeline_pushes = 0
        self.needs_sync = False  # a removal failed: re-run the reconciliation
        self.poll_interval, self.max_backoff = poll_interval, max_backoff
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def connected(self) -> bool:
        """True while the session is open and the switch has been reconciled."""
        return self.conn is not None and self.conn.is_connected

    def require(self) -> SwitchConnection:
        """The open session, or Unavailable."""
        conn = self.conn
        if conn is None or not conn.is_connected:
            detail = f": {self.last_error}" if self.last_error else ""
            raise Unavailable(f"switch {self.name} ({self.config.address}) is unreachable{detail}")
        return conn

    # -- supervisor -------------------------------------------------------------------

    def start(self) -> None:
        """Start the supervisor thread (it connects in the background)."""
        self._thread = threading.Thread(target=self._run, name=f"switch-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the supervisor and close the session (the switch keeps its entries)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.config.timeout + 2)
        with self.lock:
            self._drop(notify=False)

    def _run(self) -> None:
        backoff = self.poll_interval
        while not self._stop.is_set():
            if self.connected and not self.needs_sync:
                self._stop.wait(self.poll_interval)
                continue
            if self.conn is not None and not self.conn.is_connected:
                log.warning("switch %s: P4Runtime session lost (%s); reconnecting", self.name,
                            self.conn.stream_error)
                self.last_error = self.conn.stream_error or "session lost"
                with self.lock:
                    self._drop()
            try:
                self._sync()
                backoff = self.poll_interval
            except Exception as exc:  # the supervisor must outlive any failure
                self.last_error = str(exc)
                if isinstance(exc, (SwitchError, SwitchRejected)):
                    log.warning("switch %s: %s (retrying in %.1f s)", self.name, exc, backoff)
                else:
                    log.exception("switch %s: synchronisation failed (retrying in %.1f s)", self.name, backoff)
                with self.lock:
                    self._drop()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    def _drop(self, notify: bool = True) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            if notify:
                self.listener.switch_lost(self.name)

    def _sync(self) -> None:
        conn, fresh = self.conn, self.conn is None
        if conn is None:
            conn = SwitchConnection(self.config.address, self.config.device_id, self.config.election_id,
                                    self.config.timeout)
            conn.connect()
        with self.lock:
            try:
                self.reconcile(conn, self.listener.desired_jobs(self.name))
            except BaseException:
                if fresh:
                    conn.close()
                raise
            self.conn, self.needs_sync, self.last_error = conn, False, ""
            self.connects += int(fresh)
            self.listener.switch_synced(self.name)

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
        """Proxy ARP and routes for the configured hosts and the aggregation service address."""
        mac = self.config.mac
        return [e for h in self.config.hosts for e in host_entries(h, mac)] + \
            service_entries(self.config.service_ip, mac)

    def reconcile(self, conn: SwitchConnection, jobs: Sequence[JobEntries]) -> str:
        """Make the switch hold exactly the forwarding entries and these jobs; returns a summary."""
        pushed = self.ensure_pipeline(conn)
        desired = self.forwarding_entries() + [e for job in jobs for e in job_entries(job)]
        want = {s.key: s for s in desired}
        want_groups = {gid: sorted(replicas) for gid, replicas in map(job_group, jobs)}
        have: dict[tuple, EntrySpec] = {}
        have_groups: dict[int, list[tuple[int, int]]] = {}
        if not pushed:
            for table in p4names.TABLES:
                for entry in conn.read_entries(table):
                    spec = EntrySpec.read(entry)
                    have[spec.key] = spec
            have_groups = {gid: sorted(r) for gid, r in conn.read_multicast_groups().items()}
        stale = [s for k, s in have.items() if k not in want]
        missing = [s for s in desired if s.key not in have]
        changed = [s for s in desired if s.key in have and have[s.key] != s]
        # Stale jobs go from their job entry down, new ones are built up to it (see install_job).
        self._write(conn, [s.delete for s in stale if s.table == p4names.JOB_TABLE])
        self._write(conn, [s.delete for s in stale if s.table != p4names.JOB_TABLE])
        self._write(conn, [_group(Update.DELETE, gid, []) for gid in have_groups if gid not in want_groups])
        self._write(conn, [_group(Update.MODIFY if gid in have_groups else Update.INSERT, gid, replicas)
                           for gid, replicas in want_groups.items() if have_groups.get(gid) != replicas])
        for last in (False, True):
            self._write(conn, [s.insert for s in missing if (s.table == p4names.JOB_TABLE) == last] +
                        [s.modify for s in changed if (s.table == p4names.JOB_TABLE) == last])
        summary = (f"pipeline {'pushed' if pushed else 'kept'}, {len(missing)} entries installed, "
                   f"{len(changed)} modified, {len(stale)} removed, {len(jobs)} jobs")
        log.info("switch %s synced: %s", self.name, summary)
        return summary

    @staticmethod
    def _write(conn: SwitchConnection, steps: Sequence[Callable[[WriteBatch], WriteBatch]]) -> None:
        batch = conn.batch()
        for step in steps:
            step(batch)
        conn.write_batch(batch)

    # -- jobs -----------------------------------------------------------------------------

    def install(self, job: JobEntries) -> None:
        """Install a job (group, workers, job entry); on failure remove what was written, then
        raise Unavailable (link) or SwitchRejected. An entry already there is overwritten."""
        job.validate()
        conn = self.require()
        gid, replicas = job_group(job)
        specs = job_entries(job)
        done: list[Callable[[WriteBatch], WriteBatch]] = []
        try:
            self._upsert(conn, [_group(Update.INSERT, gid, replicas)], [_group(Update.MODIFY, gid, replicas)],
                         done, [_group(Update.DELETE, gid, [])])
            self._upsert(conn, [s.insert for s in specs[:-1]], [s.modify for s in specs[:-1]], done,
                         [s.delete for s in specs[:-1]])
            self._upsert(conn, [specs[-1].insert], [specs[-1].modify], done, [specs[-1].delete])
        except SwitchError as exc:
            for undo in reversed(done):
                try:
                    self._write(conn, [undo])
                except SwitchError:
                    self.needs_sync = True  # leftovers are removed by the next reconciliation
            if exc.code in LINK_CODES or not conn.is_connected:
                raise Unavailable(f"switch {self.name} became unreachable while installing job "
                                  f"{job.job_id}: {exc}") from None
            raise SwitchRejected(str(exc)) from None

    def _upsert(self, conn: SwitchConnection, inserts: list, modifies: list, done: list, undos: list) -> None:
        """Write inserts in one batch; retry the ALREADY_EXISTS ones as modifies; record undos."""
        try:
            self._write(conn, inserts)
            done.extend(undos)
            return
        except P4RuntimeWriteError as exc:
            failed = {e.index: e.code for e in exc.errors}
            done.extend(u for i, u in enumerate(undos) if i not in failed)
            if any(code != "ALREADY_EXISTS" for code in failed.values()):
                raise
        retry = sorted(failed)
        self._write(conn, [modifies[i] for i in retry])
        done.extend(undos[i] for i in retry)

    def remove(self, job: JobEntries) -> None:
        """Delete a job's entries, job entry first; missing ones are fine. Unreachable: nothing to
        do now, the next reconciliation removes them."""
        conn = self.conn
        if conn is None or not conn.is_connected:
            return
        specs = job_entries(job)
        steps: list[list[Callable[[WriteBatch], WriteBatch]]] = [
            [specs[-1].delete], [s.delete for s in specs[:-1]], [_group(Update.DELETE, job.mcast_grp, [])]]
        for step in steps:
            try:
                self._write(conn, step)
            except P4RuntimeWriteError as exc:
                if any(code != "NOT_FOUND" for code in exc.codes):
                    log.warning("switch %s: removing job %d: %s", self.name, job.job_id, exc)
                    self.needs_sync = True
            except SwitchError as exc:
                log.warning("switch %s: removing job %d: %s", self.name, job.job_id, exc)
                self.needs_sync = True
                return


def _group(kind: int, gid: int, replicas: Sequence[tuple[int, int]]) -> Callable[[WriteBatch], WriteBatch]:
    return lambda batch: batch.multicast_group(kind, gid, replicas)
