"""homagg-run: creates the job, hands the ranks its id and a token file (never the token on
a command line), passes the command's exit status through and releases the job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from agent_fabric import Controlled

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, stat, sys
path = os.environ["HOMAGG_TOKEN_FILE"]
assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, oct(os.stat(path).st_mode)
assert len(open(path).read()) >= 32 and "HOMAGG_TOKEN" not in os.environ
print("job", os.environ["HOMAGG_JOB_ID"], os.environ["HOMAGG_CODEC"], path)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("ctl"), 2, fabric=False)
    yield c
    c.close()


def launch(address: str, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOMAGG_TOKEN": "stale"}
    cmd = [sys.executable, "-m", "homagg.launch", "--controller", address, "--world-size", "2"]
    return subprocess.run(
        [*cmd, "--codec", "fixed_point", "--", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("status", [0, 3])
def test_exports_passes_status_and_releases(controlled, status):
    done = launch(controlled.address, sys.executable, "-c", CHILD, str(status))
    assert done.returncode == status, done.stderr
    _, job_id, codec, token_path = done.stdout.strip().splitlines()[-1].split()
    assert codec == "fixed_point" and not Path(token_path).exists()
    job = next(
        j for j in controlled.client.list_jobs(include_ended=True).jobs if j.job_id == int(job_id)
    )
    assert job.state == "ended" and job.world_size == 2


def test_refusals_are_one_clear_line(controlled):
    done = launch(controlled.address)
    assert done.returncode == 2 and "give the command after --" in done.stderr
    bad = launch("127.0.0.1:1", sys.executable, "-c", "pass")
    assert bad.returncode == 1 and "CreateJob failed at 127.0.0.1:1: UNAVAILABLE" in bad.stderr


SECURED_CHILD = """
import os
assert "HOMAGG_OPERATOR_TOKEN" not in os.environ and os.path.isfile(os.environ["HOMAGG_CA_FILE"])
print("job", os.environ["HOMAGG_JOB_ID"])
"""


def test_a_secured_controller_needs_the_credential_and_the_ranks_do_not_get_it(tmp_path):
    from agent_fabric import OPERATOR_TOKEN

    c = Controlled(tmp_path, 2, fabric=False, tls=True)
    try:
        cmd = [sys.executable, "-m", "homagg.launch", "--controller", c.address]
        cmd += ["--world-size", "2", "--", sys.executable, "-c", SECURED_CHILD]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOMAGG_CA_FILE": str(c.ca_file)}
        env.pop("HOMAGG_OPERATOR_TOKEN", None)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "UNAUTHENTICATED" in done.stderr
        env["HOMAGG_OPERATOR_TOKEN"] = OPERATOR_TOKEN  # begins with '-'
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        job_id = int(done.stdout.strip().splitlines()[-1].split()[1])
        [job] = [j for j in c.client.list_jobs(include_ended=True).jobs if j.job_id == job_id]
        assert job.state == "ended"  # released with the credential
    finally:
        c.close()
