"""homagg-run (homagg/worker/job/launch.py): starts without torch, creates the job, hands the ranks
its
id and a token file (never the token on a command line), passes the command's exit status
through and releases the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from subprocess import PIPE

import pytest

from homagg.lab.controlled import Controlled
from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import free_port

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, stat, sys
path = os.environ["HOMAGG_TOKEN_FILE"]
assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, oct(os.stat(path).st_mode)
assert len(open(path).read()) >= 32 and "HOMAGG_TOKEN" not in os.environ
print("job", os.environ["HOMAGG_JOB_ID"], os.environ["HOMAGG_CODEC"], path)
sys.exit(int(sys.argv[1]))
"""


def python_without_torch(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter, then fail it if anything imported torch."""
    check = "\nimport sys\nassert 'torch' not in sys.modules, 'imported torch'\n"
    return subprocess.run(
        [sys.executable, "-c", code + check],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_launcher_imports_no_torch():
    """A launcher must not pay for torch (15-44 s on a loaded machine): importing it, and
    its --help, import none; the torchrun it runs does."""
    done = python_without_torch("import homagg.worker.job.launch")
    assert done.returncode == 0, done.stderr


def test_homagg_run_help_imports_no_torch():
    """`homagg-run --help`: the console script's target in pyproject.toml, called as the
    script calls it, lists the codecs and imports no torch."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["homagg-run"].partition(":")
    done = python_without_torch(
        f"import sys\nfrom {module} import {function}\nsys.argv = ['homagg-run', '--help']\n"
        f"try:\n    {function}()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: homagg-run") and "fixed_point" in done.stdout
    assert "auto" in done.stdout and "HOMAGG_CONTROLLER" in done.stdout


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("ctl"), 2, fabric=False)
    yield c
    c.close()


PLAINTEXT = {"HOMAGG_INSECURE": "1", "HOMAGG_CA_FILE": ""}  # the test controller has no TLS


def launch(address: str, *command: str, secure: dict = PLAINTEXT) -> subprocess.CompletedProcess:
    """homagg-run --world-size 2 --codec fixed_point (address "": no --controller)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOMAGG_TOKEN": "stale", **secure}
    env = {k: v for k, v in env.items() if v}
    env.pop("HOMAGG_CONTROLLER", None)
    cmd = [sys.executable, "-m", "homagg.worker.job.launch", "--world-size", "2"]
    cmd += ["--controller", address] if address else []
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


def test_refusals_are_one_clear_line(controlled, tmp_path):
    """Each refusal is one line and an exit status, and the command does not run."""
    done = launch(controlled.address)
    assert done.returncode == 2 and "give the command after --" in done.stderr
    ran = tmp_path / "ran"
    touch = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    bad = launch(f"127.0.0.1:{free_port()}", *touch)
    said = [line for line in bad.stderr.splitlines() if not line.startswith("INSECURE")]
    assert bad.returncode == 1 and len(said) == 1, bad.stderr
    assert "CreateJob failed at 127.0.0.1:" in bad.stderr and ": UNAVAILABLE:" in bad.stderr
    none = launch("", *touch)  # neither --controller nor HOMAGG_CONTROLLER
    assert none.returncode == 2 and none.stderr == (
        "homagg-run: no controller: pass --controller or set HOMAGG_CONTROLLER\n"
    )
    assert not ran.exists()


def test_misuse_with_torchrun_is_refused_before_a_job_is_made(controlled):
    before = len(controlled.client.list_jobs(include_ended=True).jobs)
    other_node = ["torchrun", "--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "x.py"]
    done = launch(controlled.address, *other_node)
    assert done.returncode == 2 and "this torchrun is node rank 1" in done.stderr, done.stderr
    assert "torchrun alone on the other nodes" in done.stderr
    done = launch(controlled.address, "torchrun", "--nproc-per-node", "3", "x.py")
    assert done.returncode == 2 and "torchrun starts 1 node(s) x 3 = 3 ranks" in done.stderr
    assert len(controlled.client.list_jobs(include_ended=True).jobs) == before


# A stand-in for the training script: joins nothing, prints what torchrun gave it (one
# write of one line: the two ranks share the pipe, and print's pieces could interleave).
PRINT_RANK = (
    "import os; os.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\""
    ".encode())"
)


def test_torchruns_world_size_and_a_job_nobody_joined(controlled, tmp_path):
    """Without --world-size the job has torchrun's ranks; when no rank joins it (here the
    script never sets one up), the launcher says so, once, and still releases it."""
    script = tmp_path / "script.py"
    script.write_text(PRINT_RANK)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **PLAINTEXT}
    env = {k: v for k, v in env.items() if v}
    cmd = [
        sys.executable,
        "-m",
        "homagg.worker.job.launch",
        "--controller",
        controlled.address,
        "--",
    ]
    cmd += [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*cmd, "--nproc-per-node", "2", "--no-python", sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 of 2",
        "rank 1 of 2",
    ]
    job_id = int(done.stdout.splitlines()[0].split()[2])
    [job] = [j for j in controlled.client.list_jobs(include_ended=True).jobs if j.job_id == job_id]
    assert job.world_size == 2 and job.state == "ended"
    assert done.stderr.count(f"no rank joined job {job_id}") == 1, done.stderr


def test_plaintext_must_be_chosen(controlled):
    """Neither a CA nor HOMAGG_INSECURE=1: refused before any call (the operator credential
    would cross the network readable), saying what to set; with it chosen, one warning."""
    before = len(controlled.client.list_jobs(include_ended=True).jobs)
    unset = {"HOMAGG_INSECURE": "", "HOMAGG_CA_FILE": ""}
    done = launch(controlled.address, sys.executable, "-c", "pass", secure=unset)
    assert done.returncode == 2, done.stderr
    assert "no CA to verify the controller" in done.stderr
    assert "HOMAGG_CA_FILE" in done.stderr and "HOMAGG_INSECURE=1" in done.stderr
    assert len(controlled.client.list_jobs(include_ended=True).jobs) == before
    done = launch(controlled.address, sys.executable, "-c", "pass")
    assert done.returncode == 0 and done.stderr.count("INSECURE: plaintext") == 1, done.stderr


SECURED_CHILD = """
import os
assert "HOMAGG_OPERATOR_TOKEN" not in os.environ and os.path.isfile(os.environ["HOMAGG_CA_FILE"])
print("job", os.environ["HOMAGG_JOB_ID"])
"""


def test_a_secured_controller_needs_the_credential_and_the_ranks_do_not_get_it(tmp_path):
    from homagg.lab.controlled import OPERATOR_TOKEN

    c = Controlled(tmp_path, 2, fabric=False, tls=True)
    try:
        cmd = [sys.executable, "-m", "homagg.worker.job.launch", "--controller", c.address]
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


# Starts each host's torchrun in its namespace with what homagg-run exported; exits with the
# first failing status (argv[1]: JSON [[namespace, {environment}, [argv]], ...]).
IN_HOSTS = """
import json, os, subprocess, sys
procs = [
    subprocess.Popen(["ip", "netns", "exec", ns, *argv], env={**os.environ, **env})
    for ns, env, argv in json.loads(sys.argv[1])
]
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""


def torchrun_in_hosts(c: Controlled, port: int, script_args: list[str]) -> list[str]:
    """The launcher's command: one torchrun per host of the fabric (2 nodes, 1 rank each)."""
    assert c.fabric is not None
    spec = []
    for r, host in enumerate(c.fabric.hosts):
        env = {"GLOO_SOCKET_IFNAME": host.iface, "HOMAGG_IFACE": host.iface}
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        argv += ["--nproc-per-node", "1", "--node-rank", str(r)]
        argv += ["--master-addr", c.fabric.hosts[0].ip, "--master-port", str(port)]
        spec.append([host.namespace, env, [*argv, str(EXAMPLE), *script_args]])
    return [sys.executable, "-c", IN_HOSTS, json.dumps(spec)]


EXAMPLE = ROOT / "examples" / "train_ddp.py"


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
def test_torchrun_under_the_launcher_trains_on_the_switch(tmp_path):
    """homagg-run -> torchrun on two hosts -> examples/train_ddp.py: the ranks join the
    launcher's job from the environment it exports, train through the reference switch
    with its codec (no fallback), the job ends, and nothing warns; a failing torchrun's
    status comes back as the launcher's."""
    c = Controlled(tmp_path, 2, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **PLAINTEXT}
        env.pop("HOMAGG_CA_FILE")
        for name in ("HOMAGG_CONTROLLER", "HOMAGG_CODEC", "HOMAGG_JOB_ID", "HOMAGG_TOKEN"):
            env.pop(name, None)
        cmd = [sys.executable, "-m", "homagg.worker.job.launch", "--controller", c.address]
        cmd += ["--world-size", "2", "--codec", "fixed_point", "--"]
        save = tmp_path / "switch.pt"
        args = ["--steps", "8", "--save", str(save)]
        # the training and the failing torchrun at once, on the same hosts
        failing = [*cmd, *torchrun_in_hosts(c, 29652, ["--steps", "many"])]
        bad = subprocess.Popen(failing, env=env, stdout=PIPE, stderr=PIPE, text=True)
        try:
            done = subprocess.run(
                [*cmd, *torchrun_in_hosts(c, 29651, args)],
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            bad_err = bad.communicate(timeout=120)[1]
        finally:
            if bad.poll() is None:
                bad.kill()
                bad.wait(10)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-5000:]
        assert "not released" not in out and "homagg: rank" not in out, out[-5000:]
        stats = json.loads(save.with_suffix(".pt.json").read_text())
        assert stats == {**stats, "codec": "fixed_point", "fallbacks": 0}, stats
        assert stats["switch_buckets"] >= 8
        assert bad.returncode == 1 and "not released" not in bad_err, bad_err[-3000:]
        jobs = c.client.list_jobs(include_ended=True).jobs
    finally:
        c.close()
    assert [j.state for j in jobs] == ["ended", "ended"]
