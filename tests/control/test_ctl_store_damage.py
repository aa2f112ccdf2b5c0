"""A damaged or replaced database is refused with a clear message, never taken as a new one
(a controller with no jobs would remove every running job from its switches); a missing or
older database, which does not know jobs a switch holds, is refused at the switch's first
read-back; --fresh-database and --remove-unknown-jobs start over explicitly, without reusing
a job id a switch still holds."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from ctl_helpers import (
    HOSTS,
    RunningController,
    config_dict,
    job_state,
    join_all,
    make_config,
    rpc_code,
)

from homagg.control.config import parse_config
from homagg.control.job_record import Job, JobWorker
from homagg.control.service import ControllerServer
from homagg.control.store import Store, StoreError
from homagg.lab.addresses import SERVICE_IP
from homagg.lab.controller_process import config_toml
from homagg.lab.poll import wait_for

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
        [sys.executable, "-m", "homagg.control", "serve", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _serve_config(tmp_path: Path) -> Path:
    """A configuration whose database is tmp_path/c.db (its switch is never reached)."""
    config = tmp_path / "c.toml"
    config.write_text(
        '[controller]\nlisten = "127.0.0.1:0"\ndatabase = "c.db"\n\n'
        '[[switch]]\nname = "s1"\naddress = "127.0.0.1:1"\nmac = "02:00:00:00:00:fe"\n'
        'service_ip = "10.0.0.254"\n'
    )
    return config


def test_serve_refuses_a_zero_byte_database(tmp_path):
    config = _serve_config(tmp_path)
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


def _one_ready_job(path: Path) -> None:
    """A sound database holding job 1: two ranks joined on s1, slots 0..15."""
    store = Store(path)
    job = Job(store.take_job_id(()), "j1", "ab" * 32, 2, "dense", 16, 1000.0, "s1", 0)
    for rank, host in enumerate(HOSTS[:2]):
        job.workers[rank] = JobWorker(rank, host["mac"], host["ip"], 41000, host["switch_port"])
    store.save_job(job)
    store.close()


BAD_ROWS = {
    "world size 0": ("UPDATE jobs SET world_size = 0", "world_size"),
    "world size as text": ("UPDATE jobs SET world_size = 'two'", "world_size"),
    "codec": ("UPDATE jobs SET codec = 'two words'", "codec"),
    "pool past the slots": ("UPDATE jobs SET pool_base = 4090", "pool 4090+16"),
    "switch without a pool": ("UPDATE jobs SET pool_base = NULL", "do not go together"),
    "token hash": ("UPDATE jobs SET token_hash = 'nothex'", "token hash"),
    "rank outside the world": ("UPDATE workers SET rank = 7 WHERE rank = 1", "rank"),
    "mac": ("UPDATE workers SET mac = 'garbage'", "mac"),
    "ip": ("UPDATE workers SET ip = '300.1.2.3'", "ip"),
    "udp port": ("UPDATE workers SET udp_port = 0", "udp_port"),
    "next job id": ("UPDATE meta SET value = 'abc' WHERE key = 'next_job_id'", "next job id"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_semantically_bad_rows_are_refused(tmp_path, case):
    """A sound sqlite file whose rows no controller wrote: refused at start with the job and
    the problem named and the way to start fresh, never a crash later."""
    statement, named = BAD_ROWS[case]
    path = tmp_path / "controller.db"
    _one_ready_job(path)
    db = sqlite3.connect(path)
    db.execute(statement)
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="--fresh-database") as info:
        ControllerServer(make_config("127.0.0.1:1", tmp_path)).stop()
    assert named in str(info.value)
    if case != "next job id":
        assert "invalid row for job 1" in str(info.value)


def test_serve_refuses_bad_rows_without_a_traceback(tmp_path):
    path = tmp_path / "c.db"
    _one_ready_job(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE workers SET switch_port = 9999")
    db.commit()
    db.close()
    config = _serve_config(tmp_path)
    done = _serve(config, "--insecure")
    assert done.returncode == 2, done.stderr
    assert "invalid row for job 1" in done.stderr and "switch_port" in done.stderr
    assert "--fresh-database" in done.stderr and "Traceback" not in done.stderr


def _three_running_jobs(switch, tmp_path, start_controller, reader, copy_after: int = 0):
    """Jobs 1..3 ready on the switch (one rank each); with copy_after, a copy of the database
    taken after that many jobs (tmp_path/older.db). Returns the (stopped) database's path and
    the jobs."""
    first = start_controller(make_config(switch.address, tmp_path))
    jobs = []
    for n in range(3):
        job = first.client.create_job("run", 1, "dense", pool_size=4)
        jobs.append(job)
        join_all(first.client, job, HOSTS[n : n + 1])
        if n + 1 == copy_after:
            src = sqlite3.connect(first.config.database)
            src.backup(dst := sqlite3.connect(tmp_path / "older.db"))
            src.close()
            dst.close()
    assert set(job_state(reader())["jobs"]) == {1, 2, 3}
    first.stop()
    db = first.config.database
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return db, jobs


def _refused(ctl: RunningController) -> str:
    """The controller's refusal, once its switch was read back."""
    wait_for(lambda: ctl.server.refusal, 10, "the controller to refuse the switch")
    return ctl.server.refusal


def test_a_missing_database_never_removes_running_jobs(switch, tmp_path, start_controller, reader):
    """Jobs 1..3 run; the database file is gone (deleted, a wrong path): the new, empty
    database does not know them, so the controller refuses the switch instead of removing
    them (they keep aggregating) and no job can be created; --fresh-database removes them
    and the next id is 4; then a new database on a switch without jobs starts as usual."""
    db, jobs = _three_running_jobs(switch, tmp_path, start_controller, reader)
    ctl = start_controller(make_config(switch.address, tmp_path), sync=False)
    refusal = _refused(ctl)
    assert "switch s1 holds entries of job(s) 1, 2, 3" in refusal
    assert f"the database {db} has no record of" in refusal
    assert "created at this start: a missing file, or a wrong path?" in refusal
    assert "--fresh-database" in refusal and "--remove-unknown-jobs" in refusal
    code, _ = rpc_code(lambda: ctl.client.create_job("x", 1, "dense", pool_size=4))
    assert code == grpc.StatusCode.UNAVAILABLE
    # the jobs' workers are told to retry (NOT_FOUND would make them give the job up)
    code, details = rpc_code(lambda: ctl.client.heartbeat(jobs[0].job_id, jobs[0].token, 0))
    assert code == grpc.StatusCode.UNAVAILABLE and "refuses to start" in details
    state = job_state(reader())
    assert set(state["jobs"]) == {1, 2, 3} and len(state["workers"]) == 3
    assert not ctl.server.manager.switches["s1"].connected
    ctl.stop()

    fresh = start_controller(make_config(switch.address, tmp_path), fresh_database=True)
    assert job_state(reader())["jobs"] == {} and not fresh.server.refusal
    assert fresh.client.create_job("after", 1, "dense", pool_size=4).job_id == 4
    fresh.client.release(4)
    fresh.stop()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    plain = start_controller(make_config(switch.address, tmp_path))  # forwarding entries only
    assert not plain.server.refusal and plain.client.status().switches[0].connected


def test_an_older_database_is_refused_unless_its_unknown_jobs_may_go(
    switch, tmp_path, start_controller, reader
):
    """Jobs 1..3 run; an older but sound copy of the database (job 1 only) is put back: it
    cannot serve jobs 2 and 3 (their tokens are not in it), and removing them silently would
    end two running jobs, so the controller refuses naming them. --remove-unknown-jobs keeps
    the copy's job 1 and removes 2 and 3. Every start is gated on reading the switches back:
    while a configured switch has not been read back CreateJob answers UNAVAILABLE naming
    it, and the next id is 4, never one the switch held."""
    db, _ = _three_running_jobs(switch, tmp_path, start_controller, reader, copy_after=1)
    (tmp_path / "older.db").rename(db)
    refused = start_controller(make_config(switch.address, tmp_path), sync=False)
    refusal = _refused(refused)
    assert "holds entries of job(s) 2, 3 that the database" in refusal
    assert "an older copy of the database, or another controller's?" in refusal
    assert set(job_state(reader())["jobs"]) == {1, 2, 3}
    refused.stop()

    doc = config_dict(
        [("s1", switch.address, HOSTS), ("s2", "127.0.0.1:1", [])], tmp_path, lease=30.0
    )
    gated = start_controller(parse_config(doc, tmp_path), sync=False, remove_unknown_jobs=True)
    wait_for(lambda: gated.client.status().switches[0].connected, 10, "s1 to be read back")
    code, details = rpc_code(lambda: gated.client.create_job("early", 1, "dense", pool_size=4))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "switch(es) s2 were read back" in details
    assert set(job_state(reader())["jobs"]) == {1}  # the unknown jobs 2 and 3 were removed
    gated.stop()

    ctl = start_controller(make_config(switch.address, tmp_path))
    assert [j.job_id for j in ctl.client.list_jobs().jobs] == [1]
    assert ctl.client.create_job("after", 1, "dense", pool_size=4).job_id == 4


def test_jobs_the_database_knows_as_ended_are_removed_without_a_refusal(
    switch, tmp_path, start_controller, reader
):
    """The entries of a job whose row says it ended (its removal had not happened when the
    controller stopped) are the ordinary leftovers of the reconciliation, not unknown."""
    first = start_controller(make_config(switch.address, tmp_path))
    job = first.client.create_job("done", 1, "dense", pool_size=4)
    join_all(first.client, job, HOSTS[:1])
    first.stop()
    store = Store(first.config.database)
    [row] = store.active_jobs()
    row.ended, row.end_reason = 2000.0, "released by the operator"
    store.save_job(row)
    store.close()
    assert set(job_state(reader())["jobs"]) == {job.job_id}
    ctl = start_controller(make_config(switch.address, tmp_path))
    assert not ctl.server.refusal and job_state(reader())["jobs"] == {}


def test_serve_refuses_unknown_jobs_with_status_2(switch, tmp_path, start_controller, reader):
    """`aggctl serve` on a database that lost the switch's jobs: status 2, the reason, no
    traceback, and the jobs still on the switch."""
    _three_running_jobs(switch, tmp_path, start_controller, reader)
    doc = config_dict([("s1", switch.address, HOSTS)], tmp_path)
    doc["switch"][0]["service_ip"] = SERVICE_IP
    config = tmp_path / "c.toml"
    config.write_text(config_toml(doc))
    done = _serve(config, "--insecure")
    assert done.returncode == 2, done.stderr
    assert "aggctl: switch s1 holds entries of job(s) 1, 2, 3" in done.stderr
    assert "Traceback" not in done.stderr
    assert set(job_state(reader())["jobs"]) == {1, 2, 3}


def _failing_integrity_check(path: Path) -> None:
    """A database whose integrity check lists problems (not one sqlite refuses to read at
    all): the first garbled page that makes it so."""
    _store_with_jobs(path, 150)
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    sound = path.read_bytes()
    for page in range(1, len(sound) // 4096):
        path.write_bytes(sound)
        _garble(path, page)
        try:
            Store(path).close()
        except StoreError as exc:
            if "integrity check" in str(exc):
                return
    raise AssertionError("no garbled page fails the integrity check")


def _foreign_sqlite(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (x TEXT)")
    db.commit()
    db.close()


def _invalid_row(path: Path) -> None:
    _one_ready_job(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE workers SET mac = 'garbage'")
    db.commit()
    db.close()


DAMAGE = {
    "zero bytes": lambda path: path.write_bytes(b""),
    "random bytes": lambda path: path.write_bytes(os.urandom(8192)),
    "garbled pages": _failing_integrity_check,
    "another application's sqlite": _foreign_sqlite,
    "a row no controller wrote": _invalid_row,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_serve_refuses_a_damaged_database_in_one_line(tmp_path, damage):
    """What is wrong and what to do in one line, as every other refusal of `aggctl serve`;
    the integrity check's full list at debug level."""
    DAMAGE[damage](tmp_path / "c.db")
    done = _serve(_serve_config(tmp_path), "--insecure")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("aggctl: "), done.stderr
    assert str(tmp_path / "c.db") in lines[0] and "--fresh-database" in lines[0]
    if damage == "garbled pages":
        assert "integrity check (Page " in lines[0], lines[0]
        debug = _serve(_serve_config(tmp_path), "--insecure", "--log-level", "debug").stderr
        assert re.search(r"DEBUG integrity check of .*c\.db: Page \d+: .*; ", debug), debug
