"""The switch killed and restarted (same ports and P4Runtime address, empty: no pipeline, no
entries) while 3 workers aggregate: the controller re-pushes the pipeline and every entry,
and the workers resume with exact sums, either riding through (the straggler wait keeps
resending while the switch is back within its silence limit) or, when a round gives up
with a TransportError, realigned on the largest chunk number as the DDP hook does."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from ctl_helpers import job_state
from fault_net import (
    NEEDS_ROOT,
    TARGETS,
    InProcessController,
    backup_reader,
    config_doc,
    expected_sum,
    make_fabric,
    open_agents,
    round_parts,
    run_threads,
    wait_for,
)

from homagg.wire.constants import CELLS_PER_PKT, Op

pytestmark = NEEDS_ROOT
WORLD, BEFORE, AFTER = 3, 30, 30


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", TARGETS)
def test_workers_resume_after_a_switch_restart(target, tmp_path, fault_report):
    fabric = make_fabric(target, WORLD, tmp_path)
    ctl = None
    agents = []
    try:
        ctl = InProcessController(config_doc(fabric, tmp_path, lease=10.0), tmp_path)
        c = ctl.client
        job = c.create_job("through-restart", WORLD, "dense", pool_size=8)
        agents = open_agents(ctl.address, fabric, job, WORLD, max_retries=4)
        reader = backup_reader(fabric.switch.address)
        installed = job_state(reader)
        reader.close()
        pushes = c.status().switches[0].pipeline_pushes
        progress = {"k": 0}
        restarted = threading.Event()

        def restarter() -> None:
            wait_for(lambda: progress["k"] >= BEFORE, 60, "rounds before the restart")
            fabric.restart_switch()
            restarted.set()

        chaos = threading.Thread(target=restarter, daemon=True)
        chaos.start()

        n, k, timeouts, started = 2 * CELLS_PER_PKT, 0, 0, time.monotonic()
        failed_at: float | None = None
        resumed_after = None
        after_restart = 0  # exact rounds completed once the new switch was up
        while after_restart < AFTER:
            assert time.monotonic() - started < 90, (
                f"no progress: round {k}, {timeouts} timed-out rounds"
            )
            parts = round_parts(k, WORLD, n)
            got = run_threads(
                lambda r, parts=parts: agents[r].transport.allreduce(Op.ADD, parts[r]),
                WORLD,
                30,
            )
            errors = [g for g in got if isinstance(g, BaseException)]
            if errors:
                assert all(type(e).__name__ == "TransportError" for e in errors), errors
                timeouts += 1
                failed_at = failed_at or time.monotonic()
                agreed = max(a.transport.next_chunk for a in agents)  # the hook's realignment
                for a in agents:
                    a.transport.next_chunk = agreed
                continue
            for r in range(WORLD):
                np.testing.assert_array_equal(
                    got[r], expected_sum(parts), err_msg=f"rank {r} round {k}"
                )
            if failed_at is not None and resumed_after is None:
                resumed_after = time.monotonic() - failed_at
            if restarted.is_set():
                after_restart += 1
            k += 1
            progress["k"] = k
        chaos.join(30)
        assert restarted.is_set(), "the switch was never restarted"
        status = c.status().switches[0]
        assert status.pipeline_pushes == pushes + 1 and status.connected
        reader = backup_reader(fabric.switch.address)
        try:
            assert job_state(reader) == installed  # pipeline and every entry pushed again
        finally:
            reader.close()
        assert all(a.healthy for a in agents)
        resumed = (
            f"resumed {resumed_after:.1f} s after the first timeout"
            if resumed_after is not None
            else "no round gave up: the workers' resends rode through the restart"
        )
        fault_report(f"{k} exact rounds; {timeouts} round(s) timed out; {resumed}")
    finally:
        for a in agents:
            a.close()
        if ctl is not None:
            ctl.stop()
        fabric.close()
