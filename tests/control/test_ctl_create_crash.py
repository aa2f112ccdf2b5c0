"""CreateJob writes the job and the operator that created it in one transaction: a controller
killed (SIGKILL) before any statement of a create leaves, after its restart, the job with its
owner or no job at all; never a running job that no tenant owns (seen only by admins,
counted in no quota, holding its slots until join_timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from homagg.control.store import Store

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("create_crash_child.py")
TENANT = "tenant-a"  # create_crash_child.py's


def create_twice(database: Path, kill_at: int) -> subprocess.CompletedProcess:
    """Two creates in a child process, killed before statement `kill_at` of the second."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(CHILD), str(database), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def restarted(database: Path) -> tuple[dict[int, str], dict[int, str]]:
    """The running jobs (id: name) and owners (id: operator) a restarted controller finds."""
    store = Store(database)
    try:
        return {j.job_id: j.name for j in store.active_jobs()}, store.owners()
    finally:
        store.close()


def test_a_create_killed_before_any_statement_leaves_its_job_owned_or_absent(tmp_path):
    done = create_twice(tmp_path / "whole.db", 0)
    assert done.returncode == 0, done.stderr
    statements = int(done.stdout)
    jobs, owners = restarted(tmp_path / "whole.db")
    assert set(jobs) == {1, 2} and owners == {1: TENANT, 2: TENANT}
    assert statements >= 3  # at least a write between its transaction's begin and commit
    for kill_at in range(1, statements + 1):
        database = tmp_path / f"killed-{kill_at}.db"
        done = create_twice(database, kill_at)
        assert done.returncode == -signal.SIGKILL, (kill_at, done.stdout, done.stderr)
        jobs, owners = restarted(database)
        assert 1 in jobs and owners.get(1) == TENANT, kill_at  # the create before stands
        assert set(owners) <= {1, 2}
        for job_id in jobs:
            assert owners.get(job_id) == TENANT, f"killed at statement {kill_at}: job {job_id}"
