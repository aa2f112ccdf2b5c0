"""A worker process killed (SIGKILL) mid-job: the surviving ranks get a TransportError within
the dead rank's lease instead of hanging, the dead rank's lease expires and the controller
ends the job, removes its entries from the switch (read back over P4Runtime) and frees its
pool; the survivors' agents report why; a restarted worker then joins a new job and every
sum is exact again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from ctl_helpers import job_state
from fault_net import (
    NEEDS_ROOT,
    TARGETS,
    InProcessController,
    agent_config,
    backup_reader,
    config_doc,
    expected_sum,
    make_fabric,
    round_parts,
    run_threads,
    socket_factory,
    wait_for,
)

from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.job.agent import WorkerAgent
from homagg.worker.transport.switch_transport import TransportError

pytestmark = NEEDS_ROOT
WORLD, VICTIM, CELLS = 3, 2, CELLS_PER_PKT
LEASE = 2.0
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EMPTY = {"jobs": {}, "workers": [], "rewrites": [], "groups": {}}


def start_worker(
    ctl: InProcessController, fabric, job, tmp: Path, rounds: int, name: str
) -> subprocess.Popen:
    cfg = agent_config(ctl.address, fabric, job, VICTIM).__dict__
    ready = tmp / f"{name}.ready"
    cmd = [
        sys.executable,
        str(HERE / "fault_worker.py"),
        "--config",
        json.dumps(cfg),
        "--netns",
        fabric.hosts[VICTIM].namespace,
        "--world",
        str(WORLD),
        "--cells",
        str(CELLS),
        "--rounds",
        str(rounds),
        "--ready-file",
        str(ready),
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{HERE}"}
    with open(tmp / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def open_survivors(ctl: InProcessController, fabric, job) -> list[WorkerAgent]:
    got = run_threads(
        lambda r: WorkerAgent(
            agent_config(ctl.address, fabric, job, r, max_retries=4),
            socket_factory(fabric.hosts[r].namespace),
        ),
        VICTIM,
        40,
    )
    for g in got:
        if isinstance(g, BaseException):
            for a in got:
                if isinstance(a, WorkerAgent):
                    a.close()
            raise g
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", TARGETS)
def test_killed_worker_frees_the_job_and_survivors_do_not_hang(target, tmp_path, fault_report):
    fabric = make_fabric(target, WORLD, tmp_path)
    ctl = None
    procs: list[subprocess.Popen] = []
    agents: list[WorkerAgent] = []
    try:
        ctl = InProcessController(
            config_doc(fabric, tmp_path, lease=LEASE, heartbeat_interval=0.2), tmp_path
        )
        c = ctl.client
        job = c.create_job("victim", WORLD, "dense", pool_size=8)
        procs.append(start_worker(ctl, fabric, job, tmp_path, 0, "victim"))
        agents = open_survivors(ctl, fabric, job)
        done = {"k": 0, "killed_at": None}

        def survivor(r: int) -> tuple[int, float]:
            k = 0
            while True:
                parts = round_parts(k, WORLD, CELLS)
                try:
                    got = agents[r].transport.allreduce(Op.ADD, parts[r])
                except TransportError:
                    return k, time.monotonic()
                np.testing.assert_array_equal(
                    got, expected_sum(parts), err_msg=f"rank {r} round {k}"
                )
                k += 1
                if r == 0:
                    done["k"] = k

        results: list = []
        runner = threading.Thread(
            target=lambda: results.extend(run_threads(survivor, VICTIM, 60)), daemon=True
        )
        runner.start()
        wait_for(lambda: done["k"] >= 20, 20, "rounds with the victim alive")
        killed_at = time.monotonic()
        kill(procs[0])
        runner.join(60)
        assert not runner.is_alive()
        for got in results:
            if isinstance(got, BaseException):
                raise got
        stalls = [t - killed_at for _, t in results]
        assert max(stalls) < 10, f"survivors took {stalls} s to give up"  # the lease + a beat

        # The lease of the dead rank expires: job ended, entries gone, pool free.
        wait_for(
            lambda: not any(j.job_id == job.job_id for j in c.list_jobs().jobs),
            LEASE + 10,
            "the dead rank's lease to end the job",
        )
        expired_at = time.monotonic()
        [ended] = [j for j in c.list_jobs(include_ended=True).jobs if j.job_id == job.job_id]
        assert f"lease of rank {VICTIM} expired" in ended.end_reason
        reader = backup_reader(fabric.switch.address)
        try:
            assert job_state(reader) == EMPTY
        finally:
            reader.close()
        assert c.status().switches[0].slots_used == 0
        assert [(r.base, r.size, r.job_id) for r in c.list_pools().ranges] == [(0, 4096, 0)]
        wait_for(
            lambda: all(
                not a.healthy and f"lease of rank {VICTIM} expired" in a.unhealthy_reason
                for a in agents
            ),
            10,
            "the survivors' agents to learn why",
        )
        for a in agents:
            a.close()
        agents = []

        # A restarted worker joins a new job with the survivors; sums are exact again.
        job2 = c.create_job("after", WORLD, "dense", pool_size=8)
        assert job2.job_id > job.job_id
        procs.append(start_worker(ctl, fabric, job2, tmp_path, 30, "restarted"))
        agents = open_survivors(ctl, fabric, job2)
        again = run_threads(
            lambda r: [
                np.array_equal(
                    agents[r].transport.allreduce(Op.ADD, round_parts(k, WORLD, CELLS)[r]),
                    expected_sum(round_parts(k, WORLD, CELLS)),
                )
                for k in range(30)
            ],
            VICTIM,
            60,
        )
        assert all(not isinstance(g, BaseException) and all(g) for g in again), again
        assert procs[1].wait(30) == 0, (tmp_path / "restarted.log").read_text()
        fault_report(
            f"survivors gave up {max(stalls):.2f} s after the kill (after {results[0][0]} rounds); "
            f"job ended {expired_at - killed_at:.1f} s after the kill (lease {LEASE} s)"
        )
    finally:
        for a in agents:
            a.close()
        for p in procs:
            kill(p)
        if ctl is not None:
            ctl.stop()
        fabric.close()
