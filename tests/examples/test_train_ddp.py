"""examples/train_ddp.py, an ordinary DDP script plus `homagg.attach`, run as torchrun would
(RANK, WORLD_SIZE, MASTER_ADDR in the environment) by two ranks inside their host
namespaces, gloo and the aggregation both through the reference switch: the switch run ends
at the parameters of the same script without a controller (gloo, one warning). Beside it:
two jobs on the same hosts at once; the bad inputs of a job's set-up (a rank that never
calls attach, the controller on one rank only, codecs that differ between the ranks or from
the job's), each one message on every rank and gloo, or one error on every rank, in bounded
time; a job made outside the script runs with its codec; no log carries the job's token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from homagg.lab.controlled import Controlled, rank_env, run_in_hosts
from homagg.lab.namespace import have_privileges
from homagg.wire.constants import WORKER_UDP_BASE
from homagg.worker.job.setup import DEFAULT_READY_TIMEOUT

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
WORLD = 2
# s: a run's bound, and the join timeout of jobs made before their ranks start (a start-up
# slowed by load never ends such a job before the run's bound fails the test)
RUN_S = 180.0
# The example run through runpy with a change first (argv: the example and its arguments).
RUN = (
    "import runpy, sys; sys.argv = sys.argv[1:]; {}; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
# Every rank of two jobs returns from attach only once all four have attached (files in
# $TOGETHER_DIR; at most the run's bound): the two jobs hold their switch ports at once.
TOGETHER = f"""
import os, pathlib, runpy, sys, time
import homagg
attach, there = homagg.attach, pathlib.Path(os.environ["TOGETHER_DIR"])
def together(*args, **kw):
    state = attach(*args, **kw)
    (there / os.environ["TOGETHER_NAME"]).touch()
    deadline = time.monotonic() + {RUN_S}
    while len(list(there.iterdir())) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    return state
homagg.attach = together
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
NO_ATTACH = RUN.format("import homagg; homagg.attach = lambda *a, **k: None")
# The rank's attach timed where it runs: its seconds go to $ATTACH_SECONDS (a wait measured
# by the rank itself, which a slow start-up under load does not lengthen).
TIMED_ATTACH = """
import os, runpy, sys, time
import homagg
attach = homagg.attach
def timed(*args, **kw):
    start = time.monotonic()
    try:
        return attach(*args, **kw)
    finally:
        with open(os.environ["ATTACH_SECONDS"], "w") as f:
            f.write(str(time.monotonic() - start))
homagg.attach = timed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
DEBUG_LOGS = RUN.format("import logging; logging.basicConfig(level=logging.DEBUG)")


@pytest.fixture(scope="module")
def fab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fabric")
    c = Controlled(tmp, WORLD, fabric=True, listen=f"unix:{tmp}/ctl.sock", join_timeout=RUN_S)
    yield c
    c.close()


def run_example(
    c: Controlled,
    tmp: Path,
    tag: str,
    port: int,
    envs: list[dict[str, str]] | None = None,
    prefix: list[list[str]] | None = None,
    check: bool = True,
) -> list[str]:
    """Both ranks of the example (rank 0 saves <tag>.pt); their logs. `envs` replace the
    ranks' environments, `prefix` goes before the example's path (python -c ...)."""
    envs = envs or [rank_env(c, r, WORLD, port, controller=c.address) for r in range(WORLD)]
    argv = [str(EXAMPLE), "--steps", "8", "--save", str(tmp / f"{tag}.pt")]
    argvs = [[*(prefix[r] if prefix else []), *argv] for r in range(WORLD)]
    logs = [tmp / f"{tag}-r{r}.log" for r in range(WORLD)]
    return run_in_hosts(c, argvs, envs, logs, RUN_S, check=check)


@pytest.fixture(scope="module")
def gloo_params(fab, tmp_path_factory):
    """The example without a controller: one clear warning per rank, then gloo."""
    tmp = tmp_path_factory.mktemp("gloo")
    envs = [rank_env(fab, r, WORLD, 29612, controller="") for r in range(WORLD)]
    for t in run_example(fab, tmp, "gloo", 29612, envs):
        assert t.count("homagg: rank") == 1 and "no controller: set HOMAGG_CONTROLLER" in t
    return torch.load(tmp / "gloo.pt")


def assert_params(path: Path, want: dict[str, torch.Tensor]) -> None:
    got = torch.load(path)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-4)


def jobs_after(c: Controlled, before: set[int]) -> list:
    return [j for j in c.client.list_jobs(include_ended=True).jobs if j.job_id not in before]


def job_ids(c: Controlled) -> set[int]:
    return {j.job_id for j in c.client.list_jobs(include_ended=True).jobs}


# The example run through runpy, then the rank scrapes its own metrics endpoint into a file.
SCRAPED = (
    "import runpy, sys, urllib.request; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__'); "
    "open({!r}, 'wb').write(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read())"
)


def test_example_through_the_switch_equals_gloo(fab, gloo_params, tmp_path):
    """... and each rank's metrics endpoint (HOMAGG_METRICS_PORT, each rank in its own
    namespace) says what its hook stats say."""
    before = job_ids(fab)
    envs = [
        rank_env(fab, r, WORLD, 29611, controller=fab.address, metrics_port="9400")
        for r in range(WORLD)
    ]
    scraped = [tmp_path / f"r{r}.prom" for r in range(WORLD)]
    prefix = [["-c", SCRAPED.format(str(path))] for path in scraped]
    logs = run_example(fab, tmp_path, "switch", 29611, envs, prefix)
    stats = json.loads((tmp_path / "switch.pt.json").read_text())
    assert stats["switch_buckets"] >= 8 and stats["fallbacks"] == 0, (stats, logs)
    for path in scraped:
        fam = {f.name: f for f in text_string_to_metric_families(path.read_text())}
        buckets = {s.labels["path"]: s.value for s in fam["homagg_worker_buckets"].samples}
        assert buckets["fallback"] == 0 and buckets["switch"] >= 8
        waited = [
            s for s in fam["homagg_worker_hook_seconds"].samples if s.labels["part"] == "wait"
        ]
        assert waited[0].value > 0
    rank0 = text_string_to_metric_families(scraped[0].read_text())
    [buckets] = [f for f in rank0 if f.name == "homagg_worker_buckets"]
    assert {s.labels["path"]: s.value for s in buckets.samples}["switch"] == stats["switch_buckets"]
    assert stats["codec"] == "lossless" and all("falls back" not in t for t in logs)
    assert_params(tmp_path / "switch.pt", gloo_params)
    [job] = jobs_after(fab, before)
    assert job.state == "ended"  # released at destroy_process_group


def test_two_jobs_on_the_same_hosts_at_once(fab, gloo_params, tmp_path):
    """Both ask for UDP port WORKER_UDP_BASE + LOCAL_RANK and hold their ports at the same time (no
    rank trains before all four attached); the second to bind takes a free one before it
    joins, so both jobs run through the switch and end at gloo's parameters."""
    before = job_ids(fab)
    together = tmp_path / "together"
    together.mkdir()
    envs = [
        {
            **rank_env(fab, r, WORLD, port, controller=fab.address),
            "TOGETHER_DIR": str(together),
            "TOGETHER_NAME": f"{port}-{r}",
        }
        for port in (29613, 29614)
        for r in range(WORLD)
    ]
    argvs = [
        ["-c", TOGETHER, str(EXAMPLE), "--steps", "8", "--save", str(tmp_path / f"{tag}.pt")]
        for tag in ("a", "b")
        for _ in range(WORLD)
    ]
    logs = [tmp_path / f"{tag}-r{r}.log" for tag in ("a", "b") for r in range(WORLD)]
    texts = run_in_hosts(fab, argvs, envs, logs, RUN_S, hosts=[0, 1, 0, 1])
    assert len(list(together.iterdir())) == 4
    for tag in ("a", "b"):
        stats = json.loads((tmp_path / f"{tag}.pt.json").read_text())
        assert stats["switch_buckets"] >= 8 and stats["fallbacks"] == 0, (stats, texts)
        assert_params(tmp_path / f"{tag}.pt", gloo_params)
    a, b = jobs_after(fab, before)
    ends = [{(w.ip, w.udp_port) for w in j.workers} for j in (a, b)]
    assert len(ends[0]) == len(ends[1]) == WORLD and not ends[0] & ends[1], ends
    assert WORKER_UDP_BASE in {port for _, port in ends[0] | ends[1]}


def test_a_rank_that_never_calls_attach(fab, gloo_params, tmp_path):
    """Rank 0 waits HOMAGG_READY_TIMEOUT (3 s) for rank 1's part of the set-up, warns once
    and trains with DDP's own all_reduce, as rank 1 does: the same parameters as gloo's. Its
    attach, timed by the rank itself, ends less than halfway from the 3 s asked for to the
    default wait (60 s)."""
    envs = [
        rank_env(fab, r, WORLD, 29615, controller=fab.address, ready_timeout="3")
        for r in range(WORLD)
    ]
    seconds = tmp_path / "attach-seconds"
    envs[0]["ATTACH_SECONDS"] = str(seconds)
    prefix = [["-c", TIMED_ATTACH], ["-c", NO_ATTACH]]
    logs = run_example(fab, tmp_path, "late", 29615, envs, prefix)
    waited = float(seconds.read_text())
    assert 2.5 < waited < (3 + DEFAULT_READY_TIMEOUT) / 2, waited
    assert logs[0].count("homagg: rank") == 1, logs[0]
    assert "rank(s) [1] did not start the homagg set-up within 3 s" in logs[0]
    assert "homagg: rank" not in logs[1]
    assert json.loads((tmp_path / "late.pt.json").read_text())["switch_buckets"] == 0
    assert_params(tmp_path / "late.pt", gloo_params)


def test_the_controller_on_one_rank_only(fab, gloo_params, tmp_path):
    envs = [
        rank_env(fab, r, WORLD, 29616, controller=fab.address if r == 0 else "")
        for r in range(WORLD)
    ]
    logs = run_example(fab, tmp_path, "one", 29616, envs)
    for t in logs:  # every rank falls back together: no collective out of step
        assert t.count("homagg: rank") == 1, t
        assert "is set on rank(s) [0] but not on rank(s) [1]: give every rank" in t
    assert_params(tmp_path / "one.pt", gloo_params)


def test_codecs_that_differ_between_the_ranks_stop_both(fab, tmp_path):
    envs = [
        rank_env(fab, r, WORLD, 29617, controller=fab.address, codec=codec)
        for r, codec in enumerate(("lossless", "fixed_point"))
    ]
    for t in run_example(fab, tmp_path, "codecs", 29617, envs, check=False):
        assert "ValueError: homagg: the ranks ask for different codecs: rank 0 'lossless' " in t
        assert "rank 1 'fixed_point' (HOMAGG_CODEC)" in t


def test_a_job_made_outside_runs_its_codec_and_no_log_has_the_token(fab, gloo_params, tmp_path):
    """The launcher's way (HOMAGG_JOB_ID and a token file): the job's codec, fixed point,
    decides; a HOMAGG_CODEC that contradicts it stops both ranks with one clear error.
    The ranks log everything at DEBUG, and the token appears nowhere."""
    job = fab.create(WORLD, codec="fixed_point")
    token = tmp_path / "token"
    token.write_text(job.token)
    made = {"controller": fab.address, "job_id": str(job.job_id), "token_file": str(token)}
    envs = [rank_env(fab, r, WORLD, 29618, **made) for r in range(WORLD)]
    logs = run_example(fab, tmp_path, "made", 29618, envs, [["-c", DEBUG_LOGS]] * WORLD)
    stats = json.loads((tmp_path / "made.pt.json").read_text())
    assert stats["codec"] == "fixed_point" and stats["switch_buckets"] >= 8, (stats, logs)
    assert_params(tmp_path / "made.pt", gloo_params)
    for r, t in enumerate(logs):  # the agent logs its configuration: without the token
        assert (
            f"INFO:homagg.worker.job.agent:rank {r} in job {job.job_id}" in t
            and "AgentConfig(" in t
        )
        assert job.token not in t

    job = fab.create(WORLD, codec="fixed_point")
    token.write_text(job.token)
    made = {**made, "job_id": str(job.job_id), "codec": "lossless"}
    envs = [rank_env(fab, r, WORLD, 29619, **made) for r in range(WORLD)]
    logs = run_example(fab, tmp_path, "against", 29619, envs, [["-c", DEBUG_LOGS]] * WORLD, False)
    for t in logs:
        assert f"ValueError: homagg: job {job.job_id} runs codec 'fixed_point'" in t, t[-3000:]
        assert "HOMAGG_CODEC asks for 'lossless'" in t and job.token not in t
