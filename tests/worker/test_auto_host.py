"""codec="auto"'s host path from the hook (homagg/worker/auto/host_path.py): the bucket is
all-reduced
by the given function, divided when it completes, its cost and nonzero share reach the
controller before the decision, and a choice waits for the step before's decision."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from homagg.worker.auto import host_path as auto_host
from homagg.worker.auto.control import HOST, AutoConfig, AutoController
from homagg.worker.auto.host_path import AutoHostPath, nonzero_share


class FakeWork:
    """An all_reduce over two ranks whose other rank sent `other`, completing after `delay`."""

    def __init__(self, buf: torch.Tensor, other: torch.Tensor, delay: float) -> None:
        self.fut: torch.futures.Future = torch.futures.Future()

        def finish() -> None:
            time.sleep(delay)
            buf.add_(other)
            self.fut.set_result([buf])

        threading.Thread(target=finish, daemon=True).start()

    def get_future(self) -> torch.futures.Future:
        return self.fut


def test_a_host_bucket_is_summed_divided_and_its_cost_recorded():
    ctl = AutoController(AutoConfig(lag=0))
    path = AutoHostPath(ctl)
    buf = torch.tensor([2.0, 0.0, 4.0, 0.0])
    issued: list[torch.Tensor] = []

    def all_reduce(b: torch.Tensor) -> FakeWork:
        issued.append(b)
        return FakeWork(b, torch.tensor([2.0, 0.0, 0.0, 0.0]), 0.05)

    fut = path.issue(3, buf, all_reduce, world_size=2)
    assert issued == [buf]
    assert fut.wait().tolist() == [2.0, 0.0, 2.0, 0.0]  # (mine + the other's) / 2
    path.record()
    assert path.pending == []
    assert ctl.costs[3] >= 0.05 and ctl.nonzero[3] == 0.5  # this rank's gradient, before
    assert ctl.bucket(3).ran is not None and ctl.bucket(3).ran.method == HOST


def test_a_host_buckets_cost_leaves_out_the_wait_behind_the_bucket_before():
    ctl = AutoController(AutoConfig(lag=0))
    path = AutoHostPath(ctl)
    # issued together, completing one after the other (as a group runs its all_reduces)
    first = path.issue(0, torch.ones(4), lambda b: FakeWork(b, torch.ones(4), 0.1), 2)
    second = path.issue(1, torch.ones(4), lambda b: FakeWork(b, torch.ones(4), 0.2), 2)
    first.wait(), second.wait()
    path.record()
    assert 0.1 <= ctl.costs[0] < 0.18
    assert 0.07 <= ctl.costs[1] < 0.15, ctl.costs  # its own 0.1 s, not the 0.2 s since issue


def test_a_known_bucket_skips_its_nonzero_share():
    ctl = AutoController(AutoConfig(lag=0))
    path = AutoHostPath(ctl)
    ctl.bucket(0).exact = "lossless"
    path.issue(0, torch.zeros(4), lambda b: FakeWork(b, torch.zeros(4), 0.0), 2).wait()
    path.record()
    assert ctl.nonzero[0] == 1.0


def test_choices_wait_for_the_step_befores_decision(monkeypatch):
    path = AutoHostPath(AutoController(AutoConfig(lag=0)))
    path.wait_decided()  # nothing to wait for before the first step
    path.deciding()
    threading.Timer(0.05, path.decided.set).start()
    start = time.perf_counter()
    path.wait_decided()
    assert time.perf_counter() - start >= 0.04
    path.deciding()
    monkeypatch.setattr(auto_host, "DECISION_TIMEOUT_S", 0.01)
    with pytest.raises(RuntimeError, match="no decision"):
        path.wait_decided()


def test_nonzero_share_of_dense_and_sparse_buckets():
    assert nonzero_share(torch.tensor([0.0, 1.0, 0.0, 3.0])) == 0.5
    rows = torch.sparse_coo_tensor(torch.tensor([[1, 7]]), torch.ones(2, 3), (10, 3))
    assert nonzero_share(rows) == pytest.approx(0.2)
