"""The batched I/O path against the per-datagram reference path, through real switches (the
reference switch, and the eBPF target where root and BPF allow it): the same calls on both
paths, every sum compared bit for bit with the other path's and with the switch's own
combine (homagg/wire/combine.py): every op (ADD, OR, MAX and the lanes), the 32-bit edges
(wrapping sums, INT32_MIN and INT32_MAX), partial last chunks, and loss, duplicates and
reordering injected by the fault channel (seeded alike on both paths); under loss, with a
pool larger than the congestion window's floor, the window halves on both paths and the
sums stay exact."""

from __future__ import annotations

from functools import partial, reduce

import numpy as np
import pytest

from homagg.lab.aggjob import Job
from homagg.lab.fabric import Fabric
from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import ebpf_problem
from homagg.lab.threads import run_threads
from homagg.wire.combine import combine_cells
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.transport.channel import Channel, FaultyChannel
from homagg.worker.transport.io_path import BATCHED, IO_PATHS, PYTHON
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="transport tests need root and iproute2 (network namespaces)"
)
WORLD = 3
I32 = np.iinfo(np.int32)
FAULTS = {"loss": 0.03, "duplicate": 0.05, "reorder": 0.05}


@pytest.fixture(
    scope="module",
    params=[
        "refswitch",
        pytest.param(
            "ebpf",
            marks=pytest.mark.skipif(bool(ebpf_problem()), reason=f"eBPF: {ebpf_problem()}"),
        ),
    ],
)
def fabric(request, tmp_path_factory):
    with Fabric(request.param, WORLD, tmp_path_factory.mktemp("paths")) as f:
        for h in f.hosts:
            h.enable_ip_stack()
        yield f


def calls() -> list[tuple[Op, list[np.ndarray]]]:
    """The same calls for both paths: every op at the 32-bit edges and random values, of
    lengths that end in a partial chunk, a whole one, one cell over, one cell."""
    rng = np.random.default_rng(30)
    edges = np.array([I32.min, I32.max, -1, 0, 1, I32.max, I32.min], np.int32)
    out = []
    lengths = [3 * CELLS_PER_PKT + 5, CELLS_PER_PKT, CELLS_PER_PKT + 1, 1, 9 * CELLS_PER_PKT - 7]
    for i, op in enumerate([Op.ADD, Op.OR, Op.MAX, Op.ADD16, Op.ADD8, Op.ADD]):
        n = lengths[i % len(lengths)]
        parts = []
        for _ in range(WORLD):
            x = rng.integers(I32.min, I32.max, n, dtype=np.int64, endpoint=True).astype(np.int32)
            x[: min(n, edges.size)] = edges[: min(n, edges.size)]  # sums that wrap
            parts.append(x)
        out.append((op, parts))
    return out


def run_path(
    fabric, path: str, faulty: bool, todo, pool: int = 4, windows: list | None = None
) -> list[list[np.ndarray]]:
    """Every rank's results of `todo` on a fresh job of `pool` slots, through the given
    path; each rank's congestion window (its TransportStats) appended to `windows`."""
    job = Job(fabric, fabric.hosts, pool_size=pool)
    channels: list[Channel] = [job.channel(r) for r in range(WORLD)]
    if faulty:
        channels = [FaultyChannel(c, seed=r, **FAULTS) for r, c in enumerate(channels)]
    transports = [
        SwitchTransport(
            TransportConfig(
                job_id=job.job_id,
                rank=r,
                world_size=WORLD,
                pool_size=pool,
                initial_timeout=0.05,
                io_path=path,
            ),
            ch,
        )
        for r, ch in enumerate(channels)
    ]

    def work(r: int) -> list[np.ndarray]:
        return [transports[r].allreduce(op, parts[r]) for op, parts in todo]

    try:
        got = run_threads([partial(work, r) for r in range(WORLD)], 60)[1]
    finally:
        for t in transports:
            t.channel.close()
    if faulty:  # what the faults cost: every path resent chunks
        lost = sum(c.injected["lost"] for c in channels)  # type: ignore[attr-defined]
        assert lost > 0 and sum(t.stats.retransmissions for t in transports) > 0
    if windows is not None:
        windows.extend(t.stats for t in transports)
    return got


@pytest.mark.parametrize("faulty", [False, True], ids=["clean", "faults"])
def test_both_paths_sum_bit_for_bit_alike(fabric, faulty):
    todo = calls()
    got = {path: run_path(fabric, path, faulty, todo) for path in IO_PATHS}
    for i, (op, parts) in enumerate(todo):
        expected = reduce(partial(combine_cells, op), parts)
        for r in range(WORLD):
            assert got[BATCHED][r][i].dtype == got[PYTHON][r][i].dtype == np.int32
            np.testing.assert_array_equal(got[BATCHED][r][i], got[PYTHON][r][i])
            np.testing.assert_array_equal(got[BATCHED][r][i], expected, err_msg=f"{op.name}")


def test_under_loss_the_window_halves_and_both_paths_stay_exact(fabric):
    """A pool of 64 and 200 chunks a call under injected loss: the congestion window halves
    on the losses (below the pool) on both paths, and every sum is exact."""
    rng = np.random.default_rng(64)
    n = 200 * CELLS_PER_PKT - 3
    parts = [rng.integers(-(2**20), 2**20, n, dtype=np.int32) for _ in range(WORLD)]
    todo = [(Op.ADD, parts), (Op.ADD, parts[::-1])]
    for path in IO_PATHS:
        windows: list = []
        got = run_path(fabric, path, True, todo, pool=64, windows=windows)
        for r in range(WORLD):
            for i in range(len(todo)):
                np.testing.assert_array_equal(got[r][i], sum(parts), err_msg=path)
        assert sum(w.cwnd_halvings for w in windows) > 0, path
        assert all(1 <= w.cwnd <= 64 for w in windows)
