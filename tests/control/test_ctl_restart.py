"""`aggctl serve` as a real process, killed with SIGKILL and started again on the same database:
the running job survives (listed, entries intact, heartbeats accepted), the data plane is not
disturbed (no pipeline re-push), and whatever the switch lost or gained meanwhile is repaired
(a job the database has no record of only with --remove-unknown-jobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ctl_helpers import (
    HOSTS,
    TARGETS,
    SwitchUnderTest,
    config_dict,
    job_state,
    join_all,
)

from homagg.control.switch_connection import SwitchConnection
from homagg.lab.controller_process import ControllerProcess, write_toml
from homagg.lab.switch_process import free_port
from homagg.wire import p4names


@pytest.fixture(params=TARGETS)
def setup(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SwitchUnderTest, ControllerProcess]]:
    switch = SwitchUnderTest(request.param, tmp_path)
    address = f"127.0.0.1:{free_port()}"
    doc = config_dict(
        [("s1", switch.address, HOSTS)], tmp_path, listen=address, lease=3.0, heartbeat_interval=0.5
    )
    proc = ControllerProcess(
        write_toml(doc, tmp_path / "controller.toml"),
        address,
        tmp_path / "controller.log",
        "--log-level",
        "debug",
    )
    try:
        yield switch, proc
    finally:
        proc.kill()
        switch.stop()


def as_primary(switch: SwitchUnderTest) -> SwitchConnection:
    """A primary session while the controller is down (election id above the controller's)."""
    conn = SwitchConnection(switch.address, election_id=50, timeout=3.0)
    conn.connect()
    return conn


def test_controller_restart_keeps_the_live_job(setup):
    switch, proc = setup
    client = proc.start()
    job = client.create_job("long", 2, "dense", pool_size=64)
    join_all(client, job, HOSTS[:2])
    assert client.wait_ready(job.job_id, job.token, 0, 5).pool_size == 64
    reader = SwitchConnection(switch.address, election_id=2, timeout=3.0)
    reader.connect(require_primary=False)
    installed = job_state(reader)
    reader.close()
    generation = switch.refswitch.device.config_generation if switch.refswitch else None
    proc.kill()

    # While the controller is down: the switch loses one entry of the job and gains a stray job.
    conn = as_primary(switch)
    conn.delete_entry(p4names.WORKER_TABLE, {"hdr.agg.job_id": job.job_id, "hdr.agg.rank": 1})
    conn.insert_entry(
        p4names.JOB_TABLE,
        {"hdr.agg.job_id": 777},
        p4names.SET_JOB,
        {"pool_base": 4000, "pool_size": 8, "num_workers": 1, "mcast_grp": 777},
    )
    conn.close()

    # Job 777 is in no row of the database: the restart refuses rather than remove it (it
    # could be a running job of a database that was lost) and writes nothing.
    with pytest.raises(RuntimeError, match="exited"):
        proc.start()
    assert proc.proc is not None and proc.proc.returncode == 2
    assert "switch s1 holds entries of job(s) 777" in proc.log.read_text()
    reader = SwitchConnection(switch.address, election_id=2, timeout=3.0)
    reader.connect(require_primary=False)
    held = job_state(reader)
    reader.close()
    assert 777 in held["jobs"] and len(held["workers"]) == len(installed["workers"]) - 1

    again = ControllerProcess(proc.config, proc.address, proc.log, "--remove-unknown-jobs")
    try:
        client = again.start()
        [listed] = client.list_jobs().jobs
        assert (listed.job_id, listed.state, listed.pool_size, listed.joined) == (
            job.job_id,
            "ready",
            64,
            2,
        )
        assert client.heartbeat(job.job_id, job.token, 0).state == "ready"
        assert client.heartbeat(job.job_id, job.token, 1).state == "ready"
        status = client.status().switches[0]
        assert status.pipeline_pushes == 0 and status.slots_used == 64
        if generation is not None:
            assert switch.refswitch.device.config_generation == generation  # slots kept aggregating
        reader = SwitchConnection(switch.address, election_id=2, timeout=3.0)
        reader.connect(require_primary=False)
        assert job_state(reader) == installed  # the lost entry is back, the stray job gone
        reader.close()
        assert (
            client.create_job("next", 1, "dense").job_id > job.job_id
        )  # ids are never reused early
        client.close()
    finally:
        again.kill()


def test_switch_restarted_while_controller_was_down(setup):
    switch, proc = setup
    client = proc.start()
    job = client.create_job("both-down", 2, "dense", pool_size=16)
    join_all(client, job, HOSTS[:2])
    client.close()
    proc.kill()
    switch.restart()
    client = proc.start()
    assert client.status().switches[0].pipeline_pushes == 1
    reader = SwitchConnection(switch.address, election_id=2, timeout=3.0)
    reader.connect(require_primary=False)
    held = job_state(reader)
    reader.close()
    assert list(held["jobs"]) == [job.job_id] and len(held["workers"]) == 2
    assert client.wait_ready(job.job_id, job.token, 1, 5).job_id == job.job_id
    client.close()
