"""A switch that answers P4Runtime writes slowly delays only the job being written: the job
manager's lock is never held during a P4Runtime call (homagg/control/switch_writes.py), so other
jobs' heartbeats, Status and operator reads stay fast and their leases hold; the delayed job
then completes (writes within the switch's timeout) or fails cleanly and is installed once
the switch answers in time again."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from ctl_helpers import HOSTS, config_dict, job_state

from homagg.api.client import ControllerClient
from homagg.control.config import parse_config
from homagg.control.switch_connection import SwitchConnection
from homagg.lab.addresses import SERVICE_IP
from homagg.lab.poll import wait_for
from homagg.refswitch import p4runtime_server

INSTALL_WRITES = 4  # the P4Runtime Writes that install a job on one switch


class SlowWrites:
    """Makes every reference switch's Write sleep `delay` seconds before applying it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = p4runtime_server.apply_write
        self.delay = 0.0
        self.slowed = 0

        def slow(device: Any, request: Any) -> Any:
            if self.delay:
                self.slowed += 1
                time.sleep(self.delay)
            return real(device, request)

        monkeypatch.setattr(p4runtime_server, "apply_write", slow)


class Heartbeats:
    """Heartbeats (job, rank) pairs every 0.2 s from a thread, as workers do, recording the
    latency of each job's calls and any failure."""

    def __init__(self, client: ControllerClient, ranks: list[tuple[Any, int]]) -> None:
        self.client, self.ranks = client, ranks
        self.latency: dict[int, list[float]] = {job.job_id: [] for job, _ in ranks}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for job, rank in self.ranks:
                t0 = time.monotonic()
                try:
                    self.client.heartbeat(job.job_id, job.token, rank)
                except Exception as exc:
                    self.failures.append(f"job {job.job_id} rank {rank}: {exc}")
                self.latency[job.job_id].append(time.monotonic() - t0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def p99(self, job_id: int) -> float:
        lat = sorted(self.latency[job_id])
        return lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def _config(address: str, tmp_path: Any, switch_timeout: float) -> Any:
    doc = config_dict([("s1", address, HOSTS)], tmp_path, lease=2.0, heartbeat_interval=0.5)
    doc["switch"][0].update(service_ip=SERVICE_IP, timeout=switch_timeout)
    return parse_config(doc, tmp_path)


def _join(client: ControllerClient, job: Any, rank: int, host: int) -> Any:
    h = HOSTS[host]
    return client.join(job.job_id, job.token, rank, h["mac"], h["ip"], 41000, h["switch_port"])


def _timed(call: Any) -> float:
    t0 = time.monotonic()
    call()
    return time.monotonic() - t0


def _in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.slow
def test_slow_writes_delay_only_their_job(refswitch, tmp_path, start_controller, monkeypatch):
    """2 s per Write (the switch's timeout is 8 s): installing a job takes four writes, 8 s,
    four leases of the other job. Its heartbeats stay under 1 s p99, Status and ListJobs
    answer at once, the job stays ready; the slow job becomes ready, and its release (four
    deletes at 1 s) also leaves the other job alone."""
    slow = SlowWrites(monkeypatch)
    ctl = start_controller(_config(refswitch.address, tmp_path, switch_timeout=8.0))
    c = ctl.client
    patient = ControllerClient(ctl.address, timeout=30.0, insecure=True)
    victim = c.create_job("victim", 1, "dense", pool_size=4)
    assert _join(c, victim, 0, host=0).ready
    delayed = c.create_job("delayed", 2, "dense", pool_size=4)
    _join(c, delayed, 0, host=1)
    beats = Heartbeats(c, [(victim, 0), (delayed, 0), (delayed, 1)])
    try:
        slow.delay = 2.0
        joining, joined = _in_thread(lambda: _join(patient, delayed, 1, host=2))
        wait_for(lambda: slow.slowed >= 1, 5, "the install to reach the switch")
        reads = []
        while joining.is_alive():
            reads.append(_timed(c.status))
            reads.append(_timed(c.list_jobs))
            states = {j.job_id: j.state for j in c.list_jobs().jobs}
            assert states[victim.job_id] == "ready"
            time.sleep(0.3)
        joining.join()
        assert "error" not in joined and joined["result"].ready, joined
        assert slow.slowed >= 4
        assert max(reads) < 1.0, f"Status/ListJobs took up to {max(reads):.2f} s"

        slow.delay = 1.0
        releasing, released = _in_thread(lambda: patient.release(delayed.job_id))
        wait_for(lambda: slow.slowed >= 5, 5, "the removal to reach the switch")
        assert _timed(c.status) < 1.0
        releasing.join(30)
        assert "error" not in released, released
    finally:
        beats.stop()
        patient.close()
    beats.ranks = []
    p99 = beats.p99(victim.job_id)
    print(f"slow install: victim heartbeat p99 {p99 * 1e3:.1f} ms over {slow.slowed} slow writes")
    assert p99 < 1.0, f"heartbeat p99 {p99:.3f} s"
    assert not [f for f in beats.failures if f"job {victim.job_id} " in f], beats.failures
    states = {j.job_id: (j.state, j.end_reason) for j in c.list_jobs(include_ended=True).jobs}
    assert states[victim.job_id] == ("ready", "")
    assert states[delayed.job_id] == ("ended", "released by the operator")


@pytest.mark.slow
def test_writes_past_the_timeout_fail_cleanly(refswitch, tmp_path, start_controller, monkeypatch):
    """Writes slower than the switch's 1 s timeout: the completing join answers at once-ish
    with ready false (the join stands), the other job's heartbeats stay fast and both leases
    hold while the switch is unusable; once writes are fast again the supervisor installs the
    delayed job and WaitReady returns."""
    slow = SlowWrites(monkeypatch)
    ctl = start_controller(_config(refswitch.address, tmp_path, switch_timeout=1.0))
    c = ctl.client
    victim = c.create_job("victim", 1, "dense", pool_size=4)
    assert _join(c, victim, 0, host=0).ready
    delayed = c.create_job("delayed", 2, "dense", pool_size=4)
    _join(c, delayed, 0, host=1)
    beats = Heartbeats(c, [(victim, 0), (delayed, 0), (delayed, 1)])
    try:
        slow.delay = 1.5
        t0 = time.monotonic()
        last = _join(ControllerClient(ctl.address, timeout=30.0, insecure=True), delayed, 1, host=2)
        assert not last.ready and last.joined == 2
        assert time.monotonic() - t0 < 10  # bounded by the switch's timeout
        time.sleep(3 * 2.0)  # three leases with the switch unusable
        assert {j.job_id for j in c.list_jobs().jobs} == {victim.job_id, delayed.job_id}
        slow.delay = 0.0
        assignment = c.wait_ready(delayed.job_id, delayed.token, 0, timeout_s=20)
        assert assignment.job_id == delayed.job_id
        wait_for(lambda: c.status().switches[0].connected, 20, "the switch to be reconciled")
    finally:
        beats.stop()
    p99 = beats.p99(victim.job_id)
    print(f"writes past the timeout: victim heartbeat p99 {p99 * 1e3:.1f} ms")
    assert p99 < 1.0, f"heartbeat p99 {p99:.3f} s"
    assert not beats.failures, beats.failures
    reader = SwitchConnection(refswitch.address, election_id=1, timeout=3.0)
    reader.connect(require_primary=False)
    try:
        assert set(job_state(reader)["jobs"]) == {victim.job_id, delayed.job_id}
    finally:
        reader.close()
    assert {j.state for j in c.list_jobs().jobs} == {"ready"}


@pytest.mark.slow
def test_a_job_ended_during_its_install_is_removed_after_it(
    refswitch, tmp_path, start_controller, monkeypatch
):
    """No rank heartbeats while its job's install crawls (1.5 s per write, 6 s in all): the
    lease (2 s) ends the job mid-install. The install finishes, then the job's entries are
    removed (at full speed: the slow writes are the install's): the switch holds nothing of
    it, and its slots are free again."""
    slow = SlowWrites(monkeypatch)
    ctl = start_controller(_config(refswitch.address, tmp_path, switch_timeout=8.0))
    c = ctl.client
    job = c.create_job("doomed", 2, "dense", pool_size=4)
    _join(c, job, 0, host=0)
    slow.delay = 1.5
    patient = ControllerClient(ctl.address, timeout=30.0, insecure=True)
    try:
        joining, joined = _in_thread(lambda: _join(patient, job, 1, host=1))

        def ended() -> bool:
            jobs = c.list_jobs(include_ended=True).jobs
            return any(j.job_id == job.job_id and j.state == "ended" for j in jobs)

        wait_for(ended, 10, "the lease to end the job")
        assert joining.is_alive(), "the install was to be still in flight"
        # once the install's last write is under way, the removal after it need not crawl
        wait_for(lambda: slow.slowed >= INSTALL_WRITES, 10, "the install's last write")
        slow.delay = 0.0
        joining.join(30)
    finally:
        patient.close()
        slow.delay = 0.0
    assert "error" not in joined and not joined["result"].ready, joined
    [gone] = [j for j in c.list_jobs(include_ended=True).jobs if j.job_id == job.job_id]
    assert "lease of" in gone.end_reason
    reader = SwitchConnection(refswitch.address, election_id=1, timeout=3.0)
    reader.connect(require_primary=False)
    try:
        wait_for(
            lambda: job_state(reader) == {"jobs": {}, "workers": [], "rewrites": [], "groups": {}},
            10,
            "the ended job's entries to be removed",
        )
    finally:
        reader.close()
    assert [(r.base, r.size, r.job_id) for r in c.list_pools().ranges] == [(0, 4096, 0)]
