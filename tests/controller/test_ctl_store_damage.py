"""A damaged or replaced database is refused with a clear message, never taken as a new one
(a controller with no jobs would remove every running job from its switches), and
--fresh-database starts over explicitly without reusing a job id a switch still holds."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from ctl_helpers import HOSTS, RunningController, job_state, join_all, make_config

from controller.model import Job
from controller.store import Store, StoreError

ROOT = Path(__file__).resolve().parents[2]


def _store_with_jobs(path: Path, count: int) -> None:
    store = Store(path)
    for i in range(count):
        job_id = store.take_job_id(())
        store.save_job(Job(job_id, f"j{job_id}", "ab" * 32, 2, "dense", 16, 1000.0 + i))
    store.close()


def _garble(path: Path, page: int, page_size: int = 4096) -> None:
    """Overwrite one page (not the header page) with a pattern that is no b-tree page."""
    with open(path, "r+b") as f:
        f.seek(page * page_size)
        f.write(bytes(range(256)) * (page_size // 256))


def test_zero_byte_file_is_refused(tmp_path):
    path = tmp_path / "c.db"
    path.write_bytes(b"")
    with pytest.raises(StoreError, match=r"empty \(0 bytes\).*--fresh-database"):
        Store(path)
    assert path.stat().st_size == 0  # left as found


def test_garbled_pages_are_refused(tmp_path):
    path = tmp_path / "c.db"
    _store_with_jobs(path, 300)  # several pages of jobs
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    pages = path.stat().st_size // 4096
    assert pages >= 4
    _garble(path, pages - 1)
    with pytest.raises(StoreError, match=r"(integrity check|damaged).*--fresh-database"):
        Store(path)


def test_garbage_file_and_foreign_sqlite_are_refused(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match=r"damaged.*--fresh-database"):
        Store(junk)
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE notes (x TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a controller database"):
        Store(other)


def test_fresh_moves_the_damaged_file_aside(tmp_path):
    path = tmp_path / "c.db"
    path.write_bytes(b"")
    store = Store(path, fresh=True)
    assert store.set_aside is not None and store.set_aside.exists()
    assert store.set_aside.name.startswith("c.db.damaged-")
    assert store.active_jobs() == [] and store.take_job_id(()) == 1
    store.close()
    Store(path).close()  # the new file is a sound database


def test_raise_next_job_id(tmp_path):
    store = Store(tmp_path / "c.db")
    assert store.take_job_id(()) == 1
    store.raise_next_job_id([7, 5])
    assert store.take_job_id(()) == 8
    store.raise_next_job_id([3])  # below the counter: no change
    assert store.take_job_id(()) == 9
    store.raise_next_job_id([65535])
    assert store.take_job_id(()) == 1  # wraps past the top id
    store.close()


def _serve(config: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "controller", "serve", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_serve_refuses_a_zero_byte_database(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[controller]\nlisten = "127.0.0.1:0"\ndatabase = "c.db"\n\n'
        '[[switch]]\nname = "s1"\naddress = "127.0.0.1:1"\nmac = "02:00:00:00:00:fe"\n'
        'service_ip = "10.0.0.254"\n'
    )
    (tmp_path / "c.db").write_bytes(b"")
    done = _serve(config, "--insecure")
    assert done.returncode == 2, done.stderr
    assert "empty (0 bytes)" in done.stderr and "--fresh-database" in done.stderr
    assert "Traceback" not in done.stderr


def test_fresh_database_never_reuses_a_job_id_the_switch_holds(
    switch, tmp_path, start_controller, reader
):
    """Jobs 1..3 run; the database is replaced by an empty file: refused. With
    --fresh-database the switch's job entries are removed and the next job id is 4."""
    first = start_controller(make_config(switch.address, tmp_path))
    for _ in range(3):
        job = first.client.create_job("run", 1, "dense", pool_size=4)
        join_all(first.client, job, HOSTS[:1], udp_base=41000 + job.job_id)
    assert set(job_state(reader())["jobs"]) == {1, 2, 3}
    first.stop()
    db = first.config.database
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"")
    with pytest.raises(StoreError, match="empty"):
        start_controller(make_config(switch.address, tmp_path))
    fresh = RunningController(make_config(switch.address, tmp_path), fresh_database=True)
    try:
        fresh.wait_synced()
        assert job_state(reader())["jobs"] == {}
        job = fresh.client.create_job("after", 1, "dense", pool_size=4)
        assert job.job_id == 4
    finally:
        fresh.stop()
