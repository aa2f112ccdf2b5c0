"""One slot flooded by several senders at once, pinned to different CPUs: every round's
result must be the exact combination of every rank's contribution. A job of
MAX_WORKERS_PER_JOB ranks spread over the hosts; each host's thread sends its ranks'
contributions to a round back to back, so on the eBPF target (the program runs on the
sending CPU) packets for the same slot copy meet in the kernel on both cores; only the
slot's spin lock keeps the count and the sums right (a lost update leaves a round open
forever, or a sum wrong); there, the XDP stage adds all but each round's last
contribution and the TC program the last, under the same lock. Every target runs it."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from homagg.lab.aggjob import CounterDelta, Job, agg_frame
from homagg.lab.fabric import Fabric
from homagg.wire.combine import combine_cells
from homagg.wire.constants import CELLS_PER_PKT, MAX_WORKERS_PER_JOB, Event, Flag, Op

HOSTS = 4
RANKS = MAX_WORKERS_PER_JOB
ROUNDS = {"ebpf": 600}  # other targets: DEFAULT_ROUNDS (a few thousand packets/s)
DEFAULT_ROUNDS = 40
OPS = (Op.ADD, Op.ADD16, Op.ADD8, Op.OR, Op.MAX)
RESEND_AFTER = 1.0  # seconds without a round's results before a host resends
PATIENCE = 300.0  # seconds for the whole flood


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, HOSTS, tmp_path_factory.mktemp(target)) as f:
        yield f


def contribution(rank: int, k: int) -> tuple[np.ndarray, int]:
    """Rank's cells (the full int32 range: sums wrap) and exponent in round k."""
    rng = np.random.default_rng([rank, k])
    cells = rng.integers(-(1 << 31), 1 << 31, CELLS_PER_PKT, dtype=np.int64).astype(np.int32)
    return cells, int(rng.integers(0, 256))


def expected(k: int) -> tuple[np.ndarray, int]:
    """Round k's result cells and exponent."""
    parts = [contribution(rank, k) for rank in range(RANKS)]
    total = parts[0][0]
    for cells, _ in parts[1:]:
        total = combine_cells(OPS[k % len(OPS)], total, cells)
    return total, max(exp for _, exp in parts)


def _frames(job: Job, ranks: list[int], k: int, flags: int = 0) -> list[bytes]:
    out = []
    for rank in ranks:
        cells, exp = contribution(rank, k)
        op = OPS[k % len(OPS)]
        out.append(
            job.frame(rank, cells, slot=0, shadow=k % 2, chunk=k, op=op, exp=exp, flags=flags)
        )
    return out


def _host_loop(job: Job, host: int, rounds: int, results: dict, errors: list) -> None:
    """Host's ranks contribute to round k back to back, then wait for all their results."""
    os.sched_setaffinity(0, {host % (os.cpu_count() or 1)})  # this thread only
    ranks = list(range(host, RANKS, HOSTS))
    port = job.hosts[host].raw
    deadline = time.monotonic() + PATIENCE
    try:
        for k in range(rounds):
            for frame in _frames(job, ranks, k):
                port.send(frame)
            while any(k not in results[rank] for rank in ranks):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"host {host}: round {k} still open")
                got = port.receive(RESEND_AFTER, count=1)
                if not got:
                    for frame in _frames(job, ranks, k, Flag.RETX):
                        port.send(frame)
                for raw in got:  # agg_frame, not Scapy: the parse would bound the flood
                    parsed = agg_frame(raw)
                    if parsed is not None and parsed[0].flags & Flag.RESULT:
                        header, cells = parsed
                        results[header.rank][header.chunk] = (cells, header.exp)
    except Exception as exc:  # reported by the test
        errors.append(exc)


def test_every_sum_of_a_flooded_slot_is_exact(fabric, target):
    rounds = ROUNDS.get(target, DEFAULT_ROUNDS)
    job = Job(fabric, [fabric.hosts[r % HOSTS] for r in range(RANKS)], pool_size=1)
    fabric.drain()
    counters = CounterDelta(fabric)
    results: dict[int, dict] = {rank: {} for rank in range(RANKS)}
    errors: list[Exception] = []
    threads = [
        threading.Thread(target=_host_loop, args=(job, host, rounds, results, errors))
        for host in range(HOSTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE + 10)
    assert not errors, errors[0]
    for k in range(rounds):
        cells, exp = expected(k)
        for rank in range(RANKS):
            got_cells, got_exp = results[rank][k]
            np.testing.assert_array_equal(got_cells, cells, err_msg=f"round {k}, rank {rank}")
            assert got_exp == exp
    events = counters.events()
    assert events.get(Event.RESULT, 0) == rounds
    assert events.get(Event.CONTRIBUTION, 0) == rounds * RANKS


def test_xdp_stage_runs_natively_on_every_port(fabric, target):
    """The flood above went through the eBPF target's XDP stage (docs/ebpf.md): native XDP
    on each of the switch's veth ports, not a silent fallback."""
    if target != "ebpf":
        pytest.skip("the XDP stage is the eBPF target's")
    lines = [ln for ln in fabric.switch.log_path.read_text().splitlines() if "XDP stage:" in ln]
    assert lines and lines[0].count(" native") == HOSTS, lines
