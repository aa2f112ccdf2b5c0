"""Interrupt coalescing of a rank's results (homagg/worker/transport/result_coalescing.py):
the spacing it measures, when it naps and for how long, and that a transport whose
results trickle in takes fewer, fuller looks with every sum still exact."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import CELLS_PER_PKT, Flag, Op
from homagg.wire.header import header_view
from homagg.worker.transport.io_path import BATCHED
from homagg.worker.transport.result_coalescing import BATCH, MAX_NAP_S, ResultCoalescing
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

pytestmark = pytest.mark.unit


def test_the_spacing_is_a_moving_average_of_results_apart() -> None:
    c = ResultCoalescing()
    c.found(1, 10.0)  # the first result of a call: nothing to measure from
    assert c.spacing_s == 0.0
    c.found(2, 10.002)  # two more 2 ms later: 1 ms apart
    assert c.spacing_s == pytest.approx(0.001)
    c.found(1, 10.011)  # 9 ms for one: the average moves an eighth of the way
    assert c.spacing_s == pytest.approx(0.001 + (0.009 - 0.001) / 8)
    c.found(0, 11.0)  # a look that found nothing measures nothing
    assert c.last_at == 10.011
    c.started()  # a new call: the gap since the last one is no spacing
    c.found(1, 50.0)
    assert c.spacing_s == pytest.approx(0.002)


def test_it_naps_only_while_results_trickle_and_many_are_due() -> None:
    c = ResultCoalescing(spacing_s=0.0001, last_found=1)
    # one result a look, 100 us apart: wait for the batch's 7 more (700 us)
    assert c.nap(in_flight=BATCH, wait=1.0) == pytest.approx(0.0007)
    assert c.nap(in_flight=BATCH - 1, wait=1.0) == 0.0  # a call's tail: look at once
    assert c.nap(in_flight=64, wait=0.0002) == pytest.approx(0.0002)  # never past a timer
    c.spacing_s = 0.01  # a slow trickle: at most MAX_NAP_S
    assert c.nap(in_flight=64, wait=1.0) == MAX_NAP_S
    c.last_found = BATCH  # a full batch last time: look at once
    assert c.nap(in_flight=64, wait=1.0) == 0.0
    assert ResultCoalescing().nap(in_flight=64, wait=1.0) == 0.0  # not measured yet


class TrickleSwitch:
    """A one-worker switch on a simulated clock that answers one datagram every `spacing`
    s (a switch answering one packet at a time), counting the looks that found a result.
    The transport's clock and naps are the same simulated clock."""

    def __init__(self, spacing: float) -> None:
        self.spacing, self.now = spacing, 0.0
        self.queue: list[tuple[float, np.ndarray]] = []  # (when it is answered, datagram)
        self.looks_found = 0

    def send_many(self, rows: np.ndarray) -> None:
        last = self.queue[-1][0] if self.queue else self.now
        for row in rows:
            out = np.zeros(row.size + 1, np.uint8)
            out[:-1] = row
            header_view(out[None, :])["flags"] = int(Flag.RESULT)
            last = max(last, self.now) + self.spacing
            self.queue.append((last, out))

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def recv_many(self, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        if self.queue and self.queue[0][0] > self.now and timeout > 0:  # a poll's wait
            self.now = min(self.now + timeout, self.queue[0][0])
        due = [row for at, row in self.queue if at <= self.now]
        if not due:
            return np.zeros((0, row_bytes), np.uint8), np.zeros(0, np.int64)
        del self.queue[: len(due)]
        self.looks_found += 1
        return np.stack(due), np.full(len(due), row_bytes - 1)

    def close(self) -> None:
        pass


def test_a_trickle_of_results_is_taken_in_fuller_batches_and_summed_exactly() -> None:
    def run(coalescing: bool) -> tuple[int, float]:
        switch = TrickleSwitch(spacing=0.0002)
        cfg = TransportConfig(
            job_id=7, rank=0, world_size=1, pool_size=64, io_path=BATCHED,
            coalesce_results=coalescing,
        )  # fmt: skip
        t = SwitchTransport(cfg, switch)
        t.clock = lambda: switch.now  # type: ignore[method-assign]
        t.coalescing.sleep = switch.sleep
        cells = np.arange(60 * CELLS_PER_PKT, dtype=np.int32) - 7
        np.testing.assert_array_equal(t.allreduce(Op.ADD, cells), cells)
        assert t.stats.retransmissions == 0
        return switch.looks_found, switch.now

    looks_plain, took_plain = run(False)
    looks_batched, took_batched = run(True)
    # one result a look without it; with it about MAX_NAP_S of results a look (5 here) until
    # fewer than a batch are in flight, then one a look: 21 looks; in about the same time,
    # since the switch, not the rank, sets the pace
    assert looks_plain == 60 and looks_batched <= 0.4 * looks_plain, looks_batched
    assert took_batched <= took_plain + MAX_NAP_S
