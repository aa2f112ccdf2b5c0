"""The "homagg" torch.distributed backend. In namespaces: two ranks (gloo and the
aggregation both through the reference switch) run all_reduce calls, a hand-written
training loop and DDP without a hook (tests/worker/backend_worker.py); every result is
right, the switch carried what it can, the rest (float64 MIN, integers beyond the int32
cells, all_gather) went to gloo, and destroy_process_group released the job. Without a
controller, or with a refused token, each rank warns once and gets the same results over
gloo. On loopback without a controller: every collective other than all_reduce, by its
result. In process: the order-preserving float key and which all_reduces the switch takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import homagg
from homagg.environment import METRICS_PORT_ENV
from homagg.lab.controlled import Controlled, rank_env, run_in_hosts, run_in_hosts_timed
from homagg.lab.namespace import have_privileges
from homagg.lab.poll import wait_for
from homagg.lab.switch_process import bmv2_available
from homagg.wire.constants import WORKER_UDP_BASE
from homagg.worker.ddp import backend
from homagg.worker.ddp.backend import (
    SwitchProcessGroup,
    float_from_key,
    float_order_key,
    switch_kind,
)
from homagg.worker.job import setup as job_setup

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("backend_worker.py")
WORLD = 2
READY_S = 3.0  # HOMAGG_READY_TIMEOUT of test_a_rank_that_never_joins
needs_netns = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
TARGETS = [
    "refswitch",
    pytest.param(
        "bmv2",
        marks=pytest.mark.skipif(
            not bmv2_available(), reason="simple_switch_grpc is not installed (docs/bmv2.md)"
        ),
    ),
]


def test_float_key_orders_like_the_floats():
    x = np.array([-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 3.4e38, np.inf], np.float32)
    k = float_order_key(x)
    assert np.all(np.diff(k.astype(np.int64)) >= 0)
    assert np.array_equal(float_from_key(k), x)
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=1000).astype(np.float32), rng.normal(size=1000).astype(np.float32)
    assert np.array_equal(
        float_from_key(np.maximum(float_order_key(a), float_order_key(b))), np.maximum(a, b)
    )
    nans = np.array([np.nan, -np.nan, 1.0], np.float32)  # any NaN wins, whatever its sign
    top = float_from_key(np.maximum(float_order_key(nans), float_order_key(np.full(3, np.inf))))
    assert np.isnan(top[:2]).all() and top[2] == np.inf


def test_switch_kind():
    s, mx, avg, mn = dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG, dist.ReduceOp.MIN
    f, i = torch.ones(3), torch.ones(3, dtype=torch.int32)
    assert [switch_kind(f, o) for o in (s, avg, mx, mn)] == ["codec", "codec", "max", ""]
    assert [switch_kind(i, o) for o in (s, mx, mn)] == ["add", "max", ""]
    assert switch_kind(torch.ones(2, dtype=torch.float64), s) == ""
    assert switch_kind(torch.ones(2, dtype=torch.bool), mx) == ""
    assert [switch_kind(f.to_sparse(), o) for o in (s, avg, mx)] == ["codec", "codec", ""]
    assert switch_kind(i.to_sparse(), s) == ""
    assert switch_kind(torch.ones(0), s) == ""
    opts = dist.AllreduceOptions()  # what the backend receives: a ReduceOp, not a RedOpType
    for op, kind in ((s, "codec"), (avg, "codec"), (mx, "max"), (mn, "")):
        opts.reduceOp = op
        assert switch_kind(f, opts.reduceOp) == kind


def test_backend_codec_is_checked_at_init(monkeypatch):
    monkeypatch.delenv("HOMAGG_CONTROLLER", raising=False)
    for bad, why in (
        ("auto", " [(]codec 'auto' works with homagg.attach's hook only"),
        ("nope", ""),
    ):
        monkeypatch.setenv("HOMAGG_CODEC", bad)
        said = f"HOMAGG_CODEC on rank 0: unknown codec '{bad}'; expected one of lossless, .*{why}"
        with pytest.raises(ValueError, match=said):
            SwitchProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    monkeypatch.setenv("HOMAGG_CODEC", "fixed_point")
    with pytest.warns(RuntimeWarning, match="no controller"):
        pg = SwitchProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    assert pg.state.agent is None and pg.getBackendName() == "homagg"
    pg.shutdown()


def test_backend_serves_the_metrics_of_its_environment(monkeypatch):
    """$HOMAGG_METRICS_PORT under the backend as under attach: served (0: any free port),
    its all_reduces counted; a bad value an error at init."""
    monkeypatch.delenv("HOMAGG_CONTROLLER", raising=False)
    monkeypatch.delenv("HOMAGG_CODEC", raising=False)
    monkeypatch.setenv(METRICS_PORT_ENV, "port")
    with pytest.raises(ValueError, match="HOMAGG_METRICS_PORT='port'"):
        SwitchProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    monkeypatch.setenv(METRICS_PORT_ENV, "0")
    with pytest.warns(RuntimeWarning, match="no controller"):
        pg = SwitchProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    try:
        pg.allreduce([torch.arange(4.0)]).wait()
        with urllib.request.urlopen(pg.state.metrics.url, timeout=5) as answer:
            text = answer.read().decode()
        assert 'homagg_worker_buckets_total{job="none",path="fallback"} 1.0' in text
    finally:
        pg.shutdown()
        pg.state.metrics.close()


def test_a_world_above_the_switch_limit_runs_over_gloo(monkeypatch, tmp_path):
    """Under the backend as under the hook: a world above what the data plane takes is one
    warning, no job, and all_reduce (SUM, AVG) over the backend's gloo group, still right
    (the limit lowered to 0 for one rank; the real limit: test_job_setup.py)."""
    c = Controlled(tmp_path, 2, fabric=False)
    try:
        for name in ("HOMAGG_CODEC", "HOMAGG_JOB_ID", "HOMAGG_TOKEN", "HOMAGG_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOMAGG_CONTROLLER", c.address)
        monkeypatch.setenv("HOMAGG_INSECURE", "1")  # the test controller serves plaintext
        monkeypatch.setenv("HOMAGG_IFACE", "lo")
        monkeypatch.setattr(job_setup, "MAX_RANKS", 0)
        with pytest.warns(RuntimeWarning, match="world size 1 is above the 0 ranks") as caught:
            pg = SwitchProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
        assert len(caught) == 1 and pg.state.agent is None and pg.setup.session is None
        t = torch.arange(4.0)
        pg.allreduce([t]).wait()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.AVG)
        pg.allreduce([t], opts).wait()
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0] and pg.gloo_calls == {"fallback": 2}
        assert pg.state.stats.switch_buckets == 0
        pg.shutdown()
        assert c.client.list_jobs(include_ended=True).jobs == []
    finally:
        c.close()


def test_registered_on_import():
    assert homagg.BACKEND_NAME in dist.Backend.backend_list
    homagg.register_backend()  # idempotent
    assert dist.Backend.backend_list.count(homagg.BACKEND_NAME) == 1


@dataclass
class Ranks:
    """Both ranks of one run of backend_worker.py, started: their processes and logs."""

    tmp: Path
    tag: str
    procs: list[subprocess.Popen]
    logs: list[Path]


def start_ranks(
    c: Controlled, tmp: Path, tag: str, port: int, pause: Path | None = None, **extra: str
) -> Ranks:
    """Both ranks of backend_worker.py started in their hosts (`pause`: see run_ranks)."""
    assert c.fabric is not None
    hosts = c.fabric.hosts
    procs, logs = [], []
    for r, host in enumerate(hosts[:WORLD]):
        env = {**rank_env(c, r, WORLD, port, controller=c.address), **extra}
        env = {k: v for k, v in env.items() if v}
        cmd = ["ip", "netns", "exec", host.namespace, sys.executable, str(WORKER)]
        logs.append(tmp / f"{tag}-r{r}.log")
        with open(logs[-1], "w") as out:
            cmd.append(str(tmp / f"{tag}-r{r}.json"))
            cmd += [str(pause)] if pause is not None else []
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    return Ranks(tmp, tag, procs, logs)


def wait_ranks(ranks: Ranks, deadline: float) -> None:
    """Wait for the ranks until `deadline` (monotonic); kill the late ones."""
    for p in ranks.procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def ranks_reports(ranks: Ranks, deadline: float) -> list[dict]:
    """The ranks' reports, asserting they exited 0 by `deadline` (monotonic) and that every
    check of theirs passed."""
    wait_ranks(ranks, deadline)
    procs, logs = ranks.procs, ranks.logs
    text = "\n".join(log.read_text()[-3000:] for log in logs)
    assert all(p.returncode == 0 for p in procs), text
    reports = [json.loads((ranks.tmp / f"{ranks.tag}-r{r}.json").read_text()) for r in range(WORLD)]
    for rep in reports:
        rep["log"] = text
        assert all(rep["checks"].values()), (rep["checks"], text)
        assert rep["backend"] == "homagg"
    return reports


def run_ranks(
    c: Controlled, tmp: Path, tag: str, port: int, pause: Path | None = None, **extra: str
) -> list[dict]:
    """Both ranks of backend_worker.py; their reports (asserting they exited 0 in time).
    With `pause`, the job is released once both ranks are ready there (mid-run)."""
    ranks = start_ranks(c, tmp, tag, port, pause, **extra)
    deadline = time.monotonic() + 180  # BMv2 under load
    if pause is not None:
        wait_for(
            lambda: (
                all((pause / f"ready-{r}").exists() for r in range(WORLD))
                or any(p.poll() is not None for p in ranks.procs)
            ),
            60,
            "the ranks to reach the pause",
        )
        for job in c.client.list_jobs().jobs:
            c.client.release(job.job_id)
        (pause / "released").write_text("")
    return ranks_reports(ranks, deadline)


@needs_netns
@pytest.mark.parametrize("target", TARGETS)
def test_backend_through_the_switch(tmp_path, target):
    sock = f"unix:{tmp_path}/ctl.sock"
    c = Controlled(tmp_path, WORLD, fabric=True, listen=sock, target=target)
    try:
        reports = run_ranks(c, tmp_path, "switch", 29631)
    finally:
        c.close()
    for rep in reports:
        assert rep["fallbacks"] == 0 and "falls back" not in rep["log"], rep
        # 11 in collectives(); per step 5 gradients by hand and >= 2 DDP buckets (sparse, dense)
        assert rep["switch"] >= 11 + 4 * 5 + 4 * 2, rep
        gloo = rep["gloo_calls"]
        assert gloo.get("integers beyond the int32 cells") == 2, gloo
        assert gloo.get("not a switch operation", 0) >= 1 and "fallback" not in gloo, gloo
    assert reports[0]["jobs_after_destroy"] == ["ended"]  # left and released at destroy
    print(f"{target}: seconds per all_reduce of n float32:", reports[0]["seconds"])


@needs_netns
def test_backend_falls_back_once_with_a_reason(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:  # both runs at once, on the same hosts (each its own rendezvous port)
        job = c.create(WORLD)
        wrong = {"HOMAGG_JOB_ID": str(job.job_id), "HOMAGG_TOKEN": "hgt_wrong"}
        runs = [
            start_ranks(c, tmp_path, "none", 29632, HOMAGG_CONTROLLER=""),
            start_ranks(c, tmp_path, "refused", 29633, **wrong),
        ]
        deadline = time.monotonic() + 180
        for ranks in runs:
            wait_ranks(ranks, deadline)
        none, refused = (ranks_reports(ranks, deadline) for ranks in runs)
    finally:
        c.close()
    for reports, reason in (
        (none, "no controller: set HOMAGG_CONTROLLER"),
        (refused, "JoinJob failed"),
    ):
        for rep in reports:
            assert rep["switch"] == 0 and rep["gloo_calls"]["fallback"] > 0, rep
            assert rep["log"].count("falls back to the process group") == WORLD, rep["log"]
            assert reason in rep["log"], rep["log"]


@needs_netns
def test_backend_falls_back_when_the_job_ends_mid_run(tmp_path):
    pause = tmp_path / "pause"
    pause.mkdir()
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        reports = run_ranks(c, tmp_path, "mid", 29634, pause=pause)
    finally:
        c.close()
    for rep in reports:  # the calls before the pause went through the switch, then gloo
        assert rep["switch"] >= 9 and rep["fallbacks"] >= 1, rep
        assert rep["gloo_calls"]["fallback"] >= 4 * 5, rep
        assert rep["log"].count("falls back to the process group") == WORLD, rep["log"]


# torch's ProcessGroup methods that are no collective (names, state, set-up, hooks)
NOT_COLLECTIVES = {
    "BackendType", "CUSTOM", "GLOO", "MPI", "NCCL", "UCC", "UNDEFINED", "XCCL", "abort",
    "bound_device_id", "boxed", "get_group_store", "group_desc", "group_name",
    "merge_remote_group", "name", "rank", "set_timeout", "shutdown", "size", "split_group",
    "unbox", "use_pg_for_symm_mem_rendezvous", "_backend_id", "_device_types",
    "_enable_collectives_timing", "_end_coalescing", "_get_backend", "_get_backend_name",
    "_get_sequence_number_for_group", "_has_hooks", "_id", "_pybind11_conduit_v1_",
    "_register_backend", "_register_on_completion_hook", "_set_default_backend",
    "_set_group_desc", "_set_group_name", "_set_sequence_number_for_group",
    "_start_coalescing", "_wait_for_pending_works",
}  # fmt: skip


def test_every_collective_of_torchs_process_group_is_the_backends():
    """Each collective torch's ProcessGroup has is all_reduce (the switch) or handed to
    gloo: a torch release that adds one fails here, not in a user's script with c10d's
    "No backend type associated with device type cpu"."""
    names = {n for n in dir(dist.ProcessGroup) if not n.startswith("__")}
    collectives = names - NOT_COLLECTIVES
    assert collectives == set(backend.DELEGATED) | {"allreduce"}, collectives ^ (
        set(backend.DELEGATED) | {"allreduce"}
    )
    assert all(
        getattr(SwitchProcessGroup, n) is not getattr(dist.ProcessGroup, n) for n in collectives
    )


def test_every_collective_other_than_all_reduce_goes_to_gloo(tmp_path):
    """torch's collectives other than all_reduce (its newer names among them:
    reduce_scatter_single, all_gather_single, and the coalesced forms) reach the backend's
    gloo, not c10d's "No backend type associated with device type cpu". Two ranks on
    loopback without a controller: every call over gloo, each result checked."""
    worker = Path(__file__).with_name("backend_collectives_worker.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOMAGG_")}
    env["PYTHONPATH"] = str(ROOT)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(worker),
                str(tmp_path / f"r{r}.json"),
                str(tmp_path / "rdv"),
                str(r),
                str(WORLD),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    try:
        logs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), logs
    for r in range(WORLD):
        rep = json.loads((tmp_path / f"r{r}.json").read_text())
        assert rep["backend"] == rep["package"] == "homagg"
        assert rep["checks"] and all(rep["checks"].values()), (rep, logs[r])


def test_switch_group_names_a_foreign_group():
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    with pytest.raises(ValueError, match="not 'homagg'"):
        homagg.switch_group(gloo)


@needs_netns
def test_new_group_is_a_job_of_its_own(tmp_path):
    """dist.new_group() under the backend: a second switch job on the same hosts, its UDP
    port one the rank holds (the world's job has WORKER_UDP_BASE), both exact; destroy ends both."""
    worker = Path(__file__).with_name("backend_group_worker.py")
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        envs = [rank_env(c, r, WORLD, 29635, controller=c.address) for r in range(WORLD)]
        argvs = [[str(worker), str(tmp_path / f"r{r}.json")] for r in range(WORLD)]
        logs = [tmp_path / f"r{r}.log" for r in range(WORLD)]
        texts = run_in_hosts(c, argvs, envs, logs, 120)
        jobs = c.client.list_jobs(include_ended=True).jobs
    finally:
        c.close()
    for r in range(WORLD):
        rep = json.loads((tmp_path / f"r{r}.json").read_text())
        assert all(rep["checks"].values()), rep
        assert rep["switch"] == [2, 2] and rep["fallbacks"] == [0, 0], rep
        assert rep["ports"][0] == WORKER_UDP_BASE != rep["ports"][1], rep
        assert rep["gloo_is_plain"] and len(set(rep["jobs"])) == 2
    assert [j.state for j in jobs] == ["ended", "ended"]
    assert all("falls back" not in t for t in texts)


@needs_netns
def test_a_rank_that_never_joins(tmp_path):
    """Rank 1's controller address leads nowhere: its JoinJob fails, rank 0 waits for it in
    WaitReady for HOMAGG_READY_TIMEOUT (3 s) only; every rank warns once with both reasons
    and the hand-written loop trains over gloo to gloo's parameters. The homagg run
    outlasts the gloo run started with it on the same hosts (load slows both alike) by less
    than halfway from the 3 s asked to the default wait (60 s): no wall-clock constant."""
    example = ROOT / "examples" / "train_allreduce.py"
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    runs = (("homagg", 29636), ("gloo", 29637))  # both at once, on the same hosts
    try:
        argvs, envs, logs = [], [], []
        for tag, port in runs:
            for r in range(WORLD):
                controller = c.address if r == 0 else f"unix:{tmp_path}/nobody.sock"
                envs.append(
                    rank_env(c, r, WORLD, port, controller=controller, ready_timeout=str(READY_S))
                )
                argv = [str(example), "--steps", "4", "--backend", tag]
                argvs.append([*argv, "--save", str(tmp_path / f"{tag}.pt")])
                logs.append(tmp_path / f"{tag}-r{r}.log")
        done, seconds = run_in_hosts_timed(
            c, argvs, envs, logs, 120, hosts=[r for _ in runs for r in range(WORLD)], check=False
        )
    finally:
        c.close()
    # Exit codes are not asserted: the rank whose JoinJob failed aborts now and then in the
    # interpreter's teardown, after its work ("terminate called without an active
    # exception"; 3 in 8 runs here, with the code before this test changed too). The saved
    # parameters below need every rank's every step; any other failure leaves a traceback.
    for t in done:
        assert "Traceback" not in t and "Error:" not in t, t[-3000:]
        teardown = "terminate called without an active exception"
        assert teardown not in t or t.rstrip().endswith(teardown), t[-3000:]
    texts = done[:WORLD]  # the homagg run's ranks
    extra = max(seconds[:WORLD]) - max(seconds[WORLD:])  # the homagg run's, beyond gloo's
    assert extra < (READY_S + job_setup.DEFAULT_READY_TIMEOUT) / 2, seconds
    for t in texts:
        assert t.count("homagg: rank") == 1, t
        assert "rank 0: WaitReady failed" in t and "missing ranks [1]" in t, t
        assert "rank 1: JoinJob failed" in t and "UNAVAILABLE" in t, t
    a, b = torch.load(tmp_path / "homagg.pt"), torch.load(tmp_path / "gloo.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k])
    assert json.loads((tmp_path / "homagg.pt.json").read_text())["switch_calls"] == 0
