"""Jobs and pools persisted in sqlite, so a restarted controller rebuilds its view: each job
row carries its switch and pool (the pools are rebuilt from them), each rank its addresses,
and the meta table the next job id (ids grow across restarts and are reused only after
wrapping past 65535, so no switch still holds slots under a reused id)."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from homagg.control.job_record import Job, JobWorker
from homagg.wire.constants import MAX_JOB_ID

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: jobs.window renamed pool_size (a schema 1 database is migrated)
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id INTEGER PRIMARY KEY, name TEXT NOT NULL, token_hash TEXT NOT NULL,
    world_size INTEGER NOT NULL, codec TEXT NOT NULL, pool_size INTEGER NOT NULL,
    created REAL NOT NULL, switch TEXT, pool_base INTEGER, ended REAL, end_reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
    job_id INTEGER NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE, rank INTEGER NOT NULL,
    mac TEXT NOT NULL, ip TEXT NOT NULL, udp_port INTEGER NOT NULL, switch_port INTEGER NOT NULL,
    left_job INTEGER NOT NULL, PRIMARY KEY (job_id, rank));
"""
# created at every open, so that a database of an older controller gains it without a migration
OWNERS_TABLE = (
    "CREATE TABLE IF NOT EXISTS job_owners (job_id INTEGER PRIMARY KEY, owner TEXT NOT NULL)"
)
# A tree job's leaves and their pools (the parent's is the job's switch and pool_base); made
# at every open like job_owners
LEAVES_TABLE = (
    "CREATE TABLE IF NOT EXISTS job_leaves (job_id INTEGER NOT NULL REFERENCES jobs(job_id) "
    "ON DELETE CASCADE, switch TEXT NOT NULL, pool_base INTEGER NOT NULL, "
    "PRIMARY KEY (job_id, switch))"
)
JOB_COLUMNS = (
    "job_id, name, token_hash, world_size, codec, pool_size, created, switch, "
    "pool_base, ended, end_reason"
)


class StoreError(RuntimeError):
    """The database cannot be opened or is not a controller database of this version. Its
    message is one line (what is wrong and what to do: `aggctl serve` prints it as its
    refusal); details that take more go to the debug log."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


# What to do about a database that cannot be used (docs/controller.md, "Damaged or replaced
# database", says what a fresh start does to the switches and the job ids).
FRESH_HINT = "put back a sound copy, or start with --fresh-database to begin with no jobs"


class Store:
    """The controller's sqlite database; every method is one transaction (thread-safe).

    An existing file must be a sound controller database (not empty, integrity check passed,
    our tables): anything else is refused with StoreError rather than taken as a new one,
    since a controller with no jobs would remove every running job from the switches.
    `fresh=True` moves an existing file aside and starts an empty database.
    """

    def __init__(self, path: Path | str, fresh: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.set_aside: Path | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if fresh and self.path.exists():
                self.set_aside = self._move_aside()
            self.created = not self.path.exists()
            if not self.created and self.path.stat().st_size == 0:
                raise StoreError(
                    f"the controller database {self.path} is empty (0 bytes), not a "
                    f"controller database: {FRESH_HINT}"
                )
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the controller database {self.path}: {exc}") from exc
        try:
            self._open()
        except (sqlite3.Error, StoreError) as exc:
            self._db.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(
                f"the controller database {self.path} is damaged ({exc}): {FRESH_HINT}"
            ) from exc

    def _move_aside(self) -> Path:
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            src = self.path.with_name(self.path.name + suffix)
            if src.exists():
                src.rename(aside.with_name(aside.name + suffix))
        log.warning("started a fresh database: the previous file is kept as %s", aside)
        return aside

    def _open(self) -> None:
        db = self._db
        db.execute("PRAGMA foreign_keys = ON")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if not self.created:
            self._check_integrity()
            if version == 0:
                raise StoreError(
                    f"{self.path} is an sqlite file but not a controller database: {FRESH_HINT}"
                )
        if version not in (0, 1, SCHEMA_VERSION):
            raise StoreError(
                f"{self.path}: database schema {version}, this controller knows {SCHEMA_VERSION}"
            )
        db.execute("PRAGMA journal_mode = WAL")
        if version == 0:
            db.executescript(SCHEMA)  # idempotent: every statement is IF NOT EXISTS
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version == 1:
            db.execute("ALTER TABLE jobs RENAME COLUMN window TO pool_size")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"meta", "jobs", "workers"} <= tables:
            raise StoreError(f"{self.path} lacks the controller's tables: {FRESH_HINT}")
        db.execute(OWNERS_TABLE)
        db.execute(LEAVES_TABLE)
        db.execute(f"SELECT {JOB_COLUMNS} FROM jobs LIMIT 1").fetchall()  # columns as expected
        row = db.execute("SELECT value FROM meta WHERE key = 'next_job_id'").fetchone()
        if row is not None and not (str(row[0]).isdigit() and 1 <= int(row[0]) <= MAX_JOB_ID):
            raise StoreError(
                f"the controller database {self.path} holds an invalid next job id "
                f"({row[0]!r}, not 1..{MAX_JOB_ID}): {FRESH_HINT}"
            )

    def _check_integrity(self) -> None:
        """StoreError naming the first problem sqlite's integrity check finds (all of them,
        up to 5, at debug level)."""
        rows = [str(r[0]) for r in self._db.execute("PRAGMA integrity_check(5)")]
        if rows == ["ok"]:
            return
        lines = [x for r in rows for x in r.splitlines() if x and not x.startswith("***")]
        log.debug("integrity check of %s: %s", self.path, "; ".join(lines))
        more = f", and {len(lines) - 1} more: --log-level debug lists them" if lines[1:] else ""
        raise StoreError(
            f"the controller database {self.path} fails sqlite's integrity check "
            f"({lines[0] if lines else rows[0]}{more}): {FRESH_HINT}"
        )

    def _tx(self) -> sqlite3.Connection:
        return _Transaction(self._db)  # type: ignore[return-value]

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def take_job_id(self, in_use: Iterable[int]) -> int:
        """The next job id (1..65535, increasing, wrapping), skipping ids still in use."""
        with self._lock, self._tx():
            return self._take_job_id(set(in_use))

    def _take_job_id(self, busy: set[int]) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'next_job_id'").fetchone()
        candidate = int(row[0]) if row else 1
        for _ in range(MAX_JOB_ID):
            if candidate not in busy:
                break
            candidate = candidate % MAX_JOB_ID + 1
        else:
            raise OverflowError(f"all {MAX_JOB_ID} job ids are in use")
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('next_job_id', ?)",
            (str(candidate % MAX_JOB_ID + 1),),
        )
        return candidate

    def create_job(self, job: Job, owner: str | None, in_use: Iterable[int]) -> int:
        """Give `job` the next job id (see take_job_id) and write it with the operator that
        created it, in one transaction: a crash leaves the job with its owner or no job."""
        with self._lock, self._tx():
            job.job_id = self._take_job_id(set(in_use))
            self._write_job(job)
            if owner is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO job_owners VALUES (?, ?)", (job.job_id, owner)
                )
        return job.job_id

    def raise_next_job_id(self, seen: Iterable[int]) -> None:
        """Move the next job id past ids a switch holds (after a fresh start, or a database
        older than the switch's state), so that no id comes back while its slots may be live."""
        top = max(seen, default=0)
        if not top:
            return
        with self._lock, self._tx():
            row = self._db.execute("SELECT value FROM meta WHERE key = 'next_job_id'").fetchone()
            current = int(row[0]) if row else 1
            if current > top:
                return
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('next_job_id', ?)",
                (str(top % MAX_JOB_ID + 1),),
            )
        log.info("next job id raised to %d (the switch holds job %d)", top % MAX_JOB_ID + 1, top)

    def save_job(self, job: Job) -> None:
        """Insert or replace a job and its ranks."""
        with self._lock, self._tx():
            self._write_job(job)

    def _write_job(self, job: Job) -> None:
        self._db.execute(
            f"INSERT OR REPLACE INTO jobs ({JOB_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                job.job_id,
                job.name,
                job.token_hash,
                job.world_size,
                job.codec,
                job.pool_size,
                job.created,
                job.switch,
                job.pool_base,
                job.ended,
                job.end_reason,
            ),
        )
        self._db.execute("DELETE FROM job_leaves WHERE job_id = ?", (job.job_id,))
        self._db.executemany(
            "INSERT INTO job_leaves VALUES (?,?,?)",
            [(job.job_id, name, base) for name, base in job.leaves.items()],
        )
        self._db.execute("DELETE FROM workers WHERE job_id = ?", (job.job_id,))
        self._db.executemany(
            "INSERT INTO workers VALUES (?,?,?,?,?,?,?)",
            [
                (job.job_id, w.rank, w.mac, w.ip, w.udp_port, w.switch_port, int(w.left))
                for w in job.workers.values()
            ],
        )

    def _jobs(self, where: str, args: tuple) -> list[Job]:
        try:
            return self._read_jobs(where, args)
        except (sqlite3.DatabaseError, TypeError, ValueError) as exc:
            raise StoreError(
                f"the controller database {self.path} is damaged ({exc}): {FRESH_HINT}"
            ) from exc

    def _read_jobs(self, where: str, args: tuple) -> list[Job]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE {where}", args
            ).fetchall()
            jobs = {r[0]: Job(*r) for r in rows}
            if jobs:
                marks = ",".join("?" * len(jobs))
                for job_id, rank, mac, ip, udp_port, port, left in self._db.execute(
                    f"SELECT * FROM workers WHERE job_id IN ({marks})", tuple(jobs)
                ):
                    jobs[job_id].workers[rank] = JobWorker(
                        rank, mac, ip, udp_port, port, bool(left)
                    )
                for job_id, switch, base in self._db.execute(
                    f"SELECT job_id, switch, pool_base FROM job_leaves WHERE job_id IN ({marks}) "
                    "ORDER BY rowid",
                    tuple(jobs),
                ):
                    jobs[job_id].leaves[switch] = base
        return list(jobs.values())

    def active_jobs(self) -> list[Job]:
        """Jobs that have not ended, by id."""
        return self._jobs("ended IS NULL ORDER BY job_id", ())

    def ended_jobs(self, limit: int = 100) -> list[Job]:
        """The most recently ended jobs, newest first."""
        return self._jobs("ended IS NOT NULL ORDER BY ended DESC LIMIT ?", (limit,))

    def job(self, job_id: int) -> Job | None:
        """One job, running or ended."""
        found = self._jobs("job_id = ?", (job_id,))
        return found[0] if found else None

    def recorded(self, job_ids: Iterable[int]) -> set[int]:
        """The ids among `job_ids` that have a row (running or ended)."""
        ids = sorted(set(job_ids))
        if not ids:
            return set()
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(f"SELECT job_id FROM jobs WHERE job_id IN ({marks})", ids)
            return {r[0] for r in rows.fetchall()}

    def owners(self) -> dict[int, str]:
        """The creating operator of every job that has one."""
        try:
            with self._lock:
                rows = self._db.execute("SELECT job_id, owner FROM job_owners").fetchall()
            return dict(rows)
        except (sqlite3.DatabaseError, TypeError, ValueError) as exc:
            raise StoreError(
                f"the controller database {self.path} is damaged ({exc}): {FRESH_HINT}"
            ) from exc


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
