"""The end of an attach-ed job without `dist.destroy_process_group`, two ranks in namespaces
through the reference switch (attach_exit_worker.py): a script that exits (here rank 0 with
an exception) ends its job at exit, not by the lease; a rank killed mid-step leaves its
job to the lease, and the surviving rank's step ends with an error in bounded time instead
of hanging (a dead rank leaves no process group to fall back to)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from homagg.lab.controlled import TIMING, Controlled, rank_env, run_in_hosts
from homagg.lab.namespace import have_privileges

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
WORKER = Path(__file__).with_name("attach_exit_worker.py")
WORLD = 2


def run(tmp_path: Path, mode: str, port: int) -> tuple[list[str], object]:
    """Both ranks of `mode` (within 150 s: a hang); their logs and the job as the controller
    lists it afterwards."""
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        envs = [rank_env(c, r, WORLD, port, controller=c.address) for r in range(WORLD)]
        argvs = [[str(WORKER), mode, str(tmp_path / f"r{r}.json")] for r in range(WORLD)]
        logs = [tmp_path / f"r{r}.log" for r in range(WORLD)]
        texts = run_in_hosts(c, argvs, envs, logs, 150, check=False)
        job_id = int((tmp_path / "r0.json.job").read_text())
        deadline = time.monotonic() + 3 * TIMING["lease"]
        while True:  # a lease ends the job a little after the ranks are gone
            [job] = [j for j in c.client.list_jobs(True).jobs if j.job_id == job_id]
            if job.state == "ended" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        c.close()
    return texts, job


def test_a_script_that_exits_without_destroy_ends_its_job_at_exit(tmp_path):
    texts, job = run(tmp_path, "exit", 29681)
    assert "RuntimeError: the script fails here" in texts[0], texts[0][-3000:]
    assert "Traceback" not in texts[1], texts[1][-3000:]
    at_exit = ("released by the operator", "every rank left")  # not "lease of rank N expired"
    assert job.state == "ended" and job.end_reason in at_exit, job.end_reason
    assert all("not released" not in t and "falls back" not in t for t in texts), texts


def test_a_killed_rank_leaves_the_job_to_its_lease_and_the_other_stops(tmp_path):
    """Rank 1 is SIGKILLed before its backward: rank 0's step raises within a bound of lease
    + margin, measured by the ranks (a wall-clock bound would count their start-up under
    load). Either its bucket waits on the switch while the controller holds rank 1's lease,
    the lease ends the job, and gloo's agreement cannot reach rank 1 either; or the previous
    step's seal, still in flight over gloo when rank 1 died, reports the peer gone first,
    and rank 0's exit ends the job."""
    texts, job = run(tmp_path, "killed", 29683)
    report = json.loads((tmp_path / "r0.json").read_text())
    killed = float((tmp_path / "r1.json.killed").read_text())
    assert report["step"] == 3 and report["switch_buckets"] >= 3 * 2, report
    assert report["at"] - killed < 10 * TIMING["lease"], report  # not the 120 s straggler wait
    if "seal over the process group failed" in report["error"]:
        assert "Connection" in report["error"], report  # gloo's: closed, or reset, by peer
        assert job.end_reason in ("released by the operator", "every rank left"), job
    else:
        assert "lease of rank 1 expired" in job.end_reason, job.end_reason
        # gloo's agreement: a killed peer's connection is closed, or reset, as it happens
        assert re.search("Connection (closed|reset) by peer", report["error"]), report
        assert f"job {job.job_id} has ended: lease of rank 1 expired" in report["reason"]
    assert "Traceback" not in texts[0] and "not released" not in texts[0], texts[0][-3000:]
