"""The sqlite store: jobs and ranks round-trip, job ids grow across reopenings and wrap only
past 65535, skipping ids in use."""

from __future__ import annotations

import sqlite3

import pytest

from homagg.control.job_record import Job, JobWorker
from homagg.control.store import SCHEMA, Store, StoreError


def job(job_id: int, **kw) -> Job:
    return Job(job_id, f"j{job_id}", "ab" * 32, 2, "dense", 16, 1000.0 + job_id, **kw)


def test_jobs_round_trip(tmp_path):
    store = Store(tmp_path / "sub" / "c.db")
    j = job(3, switch="s1", pool_base=64)
    j.workers[1] = JobWorker(1, "02:00:00:00:01:02", "10.0.0.2", 41001, 2, left=True)
    store.save_job(j)
    store.save_job(job(4))
    store.close()
    store = Store(tmp_path / "sub" / "c.db")
    loaded = {x.job_id: x for x in store.active_jobs()}
    assert set(loaded) == {3, 4}
    assert (loaded[3].switch, loaded[3].pool_base, loaded[3].pool_size) == ("s1", 64, 16)
    assert loaded[3].workers == {
        1: JobWorker(1, "02:00:00:00:01:02", "10.0.0.2", 41001, 2, left=True)
    }
    assert loaded[4].switch is None and loaded[4].workers == {}
    ended = loaded[4]
    ended.ended, ended.end_reason = 2000.0, "released"
    store.save_job(ended)
    assert [x.job_id for x in store.active_jobs()] == [3]
    assert [(x.job_id, x.end_reason) for x in store.ended_jobs()] == [(4, "released")]
    assert store.job(4).ended == 2000.0 and store.job(99) is None
    store.close()


def test_job_ids_increase_across_restarts_and_wrap(tmp_path):
    store = Store(tmp_path / "c.db")
    assert [store.take_job_id([]) for _ in range(3)] == [1, 2, 3]
    store.close()
    store = Store(tmp_path / "c.db")
    assert store.take_job_id([]) == 4
    store._db.execute("UPDATE meta SET value = '65534' WHERE key = 'next_job_id'")
    assert store.take_job_id([]) == 65534
    assert store.take_job_id([65535, 1]) == 2  # wraps, skipping ids still in use
    assert store.take_job_id([]) == 3
    store.close()


def test_all_ids_in_use(tmp_path):
    store = Store(tmp_path / "c.db")
    with pytest.raises(OverflowError):
        store.take_job_id(range(1, 65536))
    store.close()


def test_foreign_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 42")
    db.close()
    with pytest.raises(StoreError, match="schema 42"):
        Store(path)
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match="cannot open"):
        Store(tmp_path / "dir.db")


def test_schema_1_database_is_migrated(tmp_path):
    """Schema 1 called the pool size `window`: such a database opens with its jobs intact."""
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace("pool_size INTEGER", "window INTEGER"))
    db.execute(
        "INSERT INTO jobs VALUES (7, 'old', 'ab', 2, 'dense', 24, 1000.0, 's1', 96, NULL, '')"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = Store(path)
    [old] = store.active_jobs()
    assert (old.job_id, old.pool_size, old.pool_base, old.switch) == (7, 24, 96, "s1")
    store.save_job(job(8))
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2
