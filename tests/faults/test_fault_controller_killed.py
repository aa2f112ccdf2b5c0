"""`aggctl serve` killed with SIGKILL while 3 workers aggregate through the switch: the data
plane keeps summing exactly while the controller is down (the agents only turn unhealthy),
and after a restart on the same database the job is recovered, no pipeline is pushed (the
slots keep their state) and the workers' heartbeats are accepted again."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fault_net import (
    NEEDS_ROOT,
    TARGETS,
    ControllerProcess,
    config_doc,
    expected_sum,
    make_fabric,
    open_agents,
    round_parts,
    run_threads,
    wait_for,
    write_toml,
)

from homagg.lab.switch_process import free_port
from homagg.wire.constants import CELLS_PER_PKT, Op

pytestmark = NEEDS_ROOT
WORLD = 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", TARGETS)
def test_aggregation_continues_while_the_controller_is_down(target, tmp_path, fault_report):
    """Rounds run continuously in worker threads from before the kill until after the
    restart; every round's sum is exact on every rank; the restarted controller lists
    the job ready, pushes no pipeline and answers the workers' heartbeats."""
    fabric = make_fabric(target, WORLD, tmp_path)
    address = f"127.0.0.1:{free_port()}"
    ctl = ControllerProcess(
        write_toml(config_doc(fabric, tmp_path, listen=address), tmp_path / "controller.toml"),
        address,
        tmp_path / "controller.log",
    )
    agents = []
    try:
        client = ctl.start()
        job = client.create_job("survives", WORLD, "dense", pool_size=8)
        agents = open_agents(ctl.address, fabric, job, WORLD)
        wait_for(lambda: all(a.heartbeats >= 1 for a in agents), 10, "first heartbeats")
        phase = {"k": 0, "last": None}  # rounds rank 0 completed; the agreed number of rounds
        marks: dict[str, int] = {}
        n = 2 * CELLS_PER_PKT

        def worker(r: int) -> list[np.ndarray]:
            out, k = [], 0
            while phase["last"] is None or k < phase["last"]:  # every rank runs the same rounds
                out.append(agents[r].transport.allreduce(Op.ADD, round_parts(k, WORLD, n)[r]))
                k += 1
                if r == 0:
                    phase["k"] = k
            return out

        results: list = []
        runner = threading.Thread(
            target=lambda: results.extend(run_threads(worker, WORLD, 100)), daemon=True
        )
        runner.start()
        wait_for(lambda: phase["k"] >= 20, 20, "rounds before the kill")
        ctl.kill()
        marks["killed"] = phase["k"]
        client.close()
        wait_for(
            lambda: not any(a.healthy for a in agents),
            10,
            "the agents to notice the controller is gone",
        )
        marks["noticed"] = phase["k"]
        wait_for(
            lambda: phase["k"] >= marks["noticed"] + 30, 30, "rounds while the controller is down"
        )
        marks["down"] = phase["k"] - marks["killed"]
        client = ctl.start()
        wait_for(lambda: all(a.healthy for a in agents), 15, "heartbeats to be answered again")
        [listed] = client.list_jobs().jobs
        assert (listed.job_id, listed.state, listed.joined) == (job.job_id, "ready", WORLD)
        status = client.status().switches[0]
        assert status.pipeline_pushes == 0 and status.slots_used == 8
        restarted_at = phase["k"]
        wait_for(lambda: phase["k"] >= restarted_at + 20, 20, "rounds after the restart")
        phase["last"] = phase["k"] + 2  # beyond any round a rank may have started
        runner.join(60)
        assert not runner.is_alive(), "a worker hung"
        for r, got in enumerate(results):
            if isinstance(got, BaseException):
                raise got
            assert len(got) >= phase["k"]
            for k, value in enumerate(got):
                np.testing.assert_array_equal(
                    value, expected_sum(round_parts(k, WORLD, n)), err_msg=f"rank {r} round {k}"
                )
        fault_report(
            f"{len(results[0])} rounds, {marks['down']} of them while the controller was down; "
            f"heartbeat failures {[a.heartbeat_failures for a in agents]}, "
            f"retransmissions {[a.transport.stats.retransmissions for a in agents]}"
        )
        client.close()
    finally:
        for a in agents:
            a.close()
        ctl.kill()
        fabric.close()
