"""`aggctl serve` as a real process, killed with SIGKILL and started again on the same database:
the running job survives (listed, entries intact, heartbeats accepted), the data plane is not
disturbed (no pipeline re-push), and whatever the switch lost or gained meanwhile is repaired."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctl_helpers import HOSTS, TARGETS, SwitchUnderTest, config_dict, job_state, join_all, wait_for

from aggwire import p4names
from controller.client import ControllerClient
from controller.switch_connection import SwitchConnection
from testnet.switch_process import free_port


def write_toml(doc: dict, path: Path) -> Path:
    """A minimal TOML writer for config_dict() documents (tables, arrays of tables, scalars)."""
    def value(v: object) -> str:
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return str(v).lower() if isinstance(v, bool) else str(v)
    lines = ["[controller]"] + [f"{k} = {value(v)}" for k, v in doc["controller"].items()]
    for sw in doc["switch"]:
        lines += ["", "[[switch]]"] + [f"{k} = {value(v)}" for k, v in sw.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class ControllerProcess:
    """`python -m controller serve` on a fixed port; kill() is SIGKILL by PID."""

    def __init__(self, config: Path, address: str, log: Path) -> None:
        self.config, self.address, self.log = config, address, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> ControllerClient:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "controller", "serve", "--config", str(self.config),
                                          "--log-level", "debug"], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        client = ControllerClient(self.address, timeout=2.0)

        def synced() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return all(s.connected for s in client.status().switches)
            except Exception:
                return False
        wait_for(synced, 20, "the controller process to serve and sync")
        return client

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(params=TARGETS)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SwitchUnderTest, ControllerProcess]]:
    switch = SwitchUnderTest(request.param, tmp_path)
    address = f"127.0.0.1:{free_port()}"
    doc = config_dict([("s1", switch.address, HOSTS)], tmp_path, listen=address, lease=3.0, heartbeat_interval=0.5)
    proc = ControllerProcess(write_toml(doc, tmp_path / "controller.toml"), address, tmp_path / "controller.log")
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
    job = client.create_job("long", 2, "dense", window=64)
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
    conn.insert_entry(p4names.JOB_TABLE, {"hdr.agg.job_id": 777}, p4names.SET_JOB,
                      {"pool_base": 4000, "pool_size": 8, "num_workers": 1, "mcast_grp": 777})
    conn.close()

    client = proc.start()
    [listed] = client.list_jobs().jobs
    assert (listed.job_id, listed.state, listed.pool_size, listed.joined) == (job.job_id, "ready", 64, 2)
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
    assert client.create_job("next", 1, "dense").job_id > job.job_id  # ids are never reused early
    client.close()


def test_switch_restarted_while_controller_was_down(setup):
    switch, proc = setup
    client = proc.start()
    job = client.create_job("both-down", 2, "dense", window=16)
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
