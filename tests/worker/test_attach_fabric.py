"""homagg.attach in namespaces, two ranks through the reference switch (attach_worker.py):
the job ends when the process group is destroyed (not only at exit), attach can run again
in a new process group and twice in one (each job on its own UDP port), with the
asynchronous hook and codec "auto", and attaching adds no exit handler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homagg.lab.controlled import Controlled, rank_env, run_in_hosts
from homagg.lab.namespace import have_privileges
from homagg.wire.constants import WORKER_UDP_BASE

WORKER = Path(__file__).with_name("attach_worker.py")
WORLD = 2


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
def test_destroy_ends_the_job_and_attach_runs_again(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        envs = [rank_env(c, r, WORLD, 29661, controller=c.address) for r in range(WORLD)]
        argvs = [[str(WORKER), str(tmp_path / f"r{r}.json")] for r in range(WORLD)]
        logs = [tmp_path / f"r{r}.log" for r in range(WORLD)]
        texts = run_in_hosts(c, argvs, envs, logs, 180)
    finally:
        c.close()
    reports = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(WORLD)]
    for rep in reports:
        assert rep["atexit_added"] == 0, rep
        assert rep["first"]["switch"] >= 3 * 2 and rep["first"]["fallbacks"] == 0, rep
        assert len(set(rep["ports"])) == 2 and WORKER_UDP_BASE in rep["ports"], rep
        assert rep["after_destroy"]["agents_closed"] == [True, True], rep
        assert rep["after_destroy"]["sessions"] == 0, rep
        again = rep["again"]
        assert again["fallbacks"] == [0, 0], again
        assert again["asynchronous"] == [True, True] and again["codecs"] == ["lossless", "auto"]
        # the lossless model's buckets all go through the switch; auto measures the host
        # path and probes the switch's exact codec (docs/worker.md), so it runs both
        lossless_buckets, auto_switch_buckets = again["switch"]
        assert lossless_buckets >= 4 and auto_switch_buckets >= 1, again
        choices = again["auto_choices"]
        assert sum(choices.values()) >= 4 and choices.get("host", 0) >= 1, again
        assert sum(n for c, n in choices.items() if c != "host") >= 1, again
    assert reports[0]["after_destroy"]["jobs"] == ["ended", "ended"]
    assert reports[0]["again"]["jobs"] == ["ended", "ended"]
    assert all("falls back" not in t for t in texts)
