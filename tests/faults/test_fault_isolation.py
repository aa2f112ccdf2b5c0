"""Two jobs on one switch, both installed by the controller: a worker of job A forging
contributions into job B (B's job id, B's ranks, B's slots and chunk numbers) from its own
port is dropped as WRONG_PORT (worker_table entries are keyed to the registered ingress
port), and reaching past its own pool is dropped as SLOT_OUT_OF_POOL; both jobs' sums stay
exact meanwhile, and A's token does not let it join B."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from fault_net import (
    NEEDS_ROOT,
    TARGETS,
    InProcessController,
    agent_config,
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
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

pytestmark = NEEDS_ROOT
ROUNDS, POOL_SIZE = 100, 8


def drops(c) -> dict[str, int]:
    return {v.name: v.packets for v in c.counters().switches[0].ingress_drops}


def forged(
    job_id: int, rank: int, pool_size: int, first: int, count: int, channel
) -> SwitchTransport:
    """A transport that packs another identity's packets, over the attacker's channel."""
    t = SwitchTransport(
        TransportConfig(job_id=job_id, rank=rank, world_size=2, pool_size=pool_size), channel
    )
    t.next_chunk = first
    return t


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", TARGETS)
def test_a_worker_cannot_write_into_another_jobs_slots(target, tmp_path, fault_report):
    fabric = make_fabric(target, 4, tmp_path)
    ctl = None
    agents: list[WorkerAgent] = []
    try:
        ctl = InProcessController(config_doc(fabric, tmp_path, lease=10.0), tmp_path)
        c = ctl.client
        a = c.create_job("A", 2, "dense", pool_size=POOL_SIZE)
        b = c.create_job("B", 2, "dense", pool_size=POOL_SIZE)
        # ranks 0, 1 of A on hosts 0, 1; ranks 0, 1 of B on hosts 2, 3
        specs = [(a, 0, 0), (a, 1, 1), (b, 0, 2), (b, 1, 3)]
        got = run_threads(
            lambda i: WorkerAgent(
                agent_config(ctl.address, fabric, specs[i][0], specs[i][1], host=specs[i][2]),
                socket_factory(fabric.hosts[specs[i][2]].namespace),
            ),
            4,
            40,
        )
        agents = [g for g in got if isinstance(g, WorkerAgent)]
        assert len(agents) == 4, got

        code = None
        try:
            c.join(
                b.job_id,
                a.token,
                0,
                fabric.hosts[0].mac,
                fabric.hosts[0].ip,
                41000,
                fabric.hosts[0].switch_port,
            )
        except grpc.RpcError as exc:
            code = exc.code()
        assert code == grpc.StatusCode.UNAUTHENTICATED

        before = drops(c)
        attacker = agents[0].transport.channel  # job A's rank 0, on host 0 / port 1
        garbage = np.full(CELLS_PER_PKT, 1 << 20, np.int32)
        sent = {"WRONG_PORT": 0, "SLOT_OUT_OF_POOL": 0}

        def attack(k: int) -> None:
            for rank in (0, 1):  # B's identities, B's slot and chunk of round k
                t = forged(b.job_id, rank, POOL_SIZE, k, 1, attacker)
                attacker.send(
                    t.pack_chunks(Op.ADD, k, garbage.reshape(1, -1), CELLS_PER_PKT)[0].tobytes()
                )
                sent["WRONG_PORT"] += 1
            # A's own id, a slot beyond its pool
            t = forged(a.job_id, 0, 4096, POOL_SIZE + k, 1, attacker)
            packed = t.pack_chunks(Op.ADD, POOL_SIZE + k, garbage.reshape(1, -1), CELLS_PER_PKT)
            attacker.send(packed[0].tobytes())
            sent["SLOT_OUT_OF_POOL"] += 1

        def work(i: int) -> list[np.ndarray]:
            job, rank = specs[i][0], specs[i][1]
            out = []
            for k in range(ROUNDS):
                if job is a and rank == 0:  # A's rank 0 forges before each of its honest rounds
                    attack(k)  # (paced by its rounds, interleaved with honest traffic)
                out.append(
                    agents[i].transport.allreduce(
                        Op.ADD, round_parts(1000 * job.job_id + k, 2, CELLS_PER_PKT)[rank]
                    )
                )
            return out

        results = run_threads(work, 4, 90)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        for i in (2, 3):  # B's ranks: every sum exact although A forged into every round
            for k, value in enumerate(results[i]):
                np.testing.assert_array_equal(
                    value,
                    expected_sum(round_parts(1000 * b.job_id + k, 2, CELLS_PER_PKT)),
                    err_msg=f"job B rank {specs[i][1]} round {k}",
                )
        for i in (0, 1):  # A's ranks too
            for k, value in enumerate(results[i]):
                np.testing.assert_array_equal(
                    value,
                    expected_sum(round_parts(1000 * a.job_id + k, 2, CELLS_PER_PKT)),
                    err_msg=f"job A rank {i} round {k}",
                )

        # the drops were counted by reason, one per forged packet
        def delta() -> dict[str, int]:
            after = drops(c)
            return {k: after.get(k, 0) - before.get(k, 0) for k in sent}

        wait_for(
            lambda: delta() == sent, 15, f"drops counted by reason to reach {sent} (last {delta()})"
        )
        fault_report(f"forged {sent}; drops counted {delta()}; job B: {ROUNDS} exact rounds")
    finally:
        for ag in agents:
            ag.close()
        if ctl is not None:
            ctl.stop()
        fabric.close()
