"""codec="auto" through the real transport: two ranks in namespaces, the reference switch,
homagg.attach, and each host's link shaped by a tc token bucket (tbf) for a window of
steps: compression rises while the link is slow and falls after, and both ranks decide
alike at every step (auto_link_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from homagg.lab.controlled import Controlled, rank_env, run_in_hosts
from homagg.lab.namespace import have_privileges

WORKER = Path(__file__).with_name("auto_link_worker.py")
WORLD = 2
STEPS, FIRST, END = 34, 10, 20  # the link is shaped for steps FIRST..END-1
RATE = "1mbit"  # 132 kB of gradients take ~1 s: beyond the budget (~0.4 s), uncompressed


def density(label: str) -> float:
    """The wire density of a choice: exact paths 1, lanes and CLT-k their own."""
    if label in ("lossless", "fixed_point", "host"):
        return 1.0
    if label in ("lowbit16", "lowbit8"):
        return {"lowbit16": 0.5, "lowbit8": 0.25}[label]
    return float(label.split("@")[1])


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
@pytest.mark.timeout(240)
def test_compression_rises_on_a_slow_link_and_falls_after_on_every_rank(tmp_path):
    c = Controlled(tmp_path, WORLD, fabric=True, listen=f"unix:{tmp_path}/ctl.sock")
    try:
        envs = [rank_env(c, r, WORLD, 29671, controller=c.address) for r in range(WORLD)]
        argvs = [
            [str(WORKER), str(tmp_path / f"r{r}.json"), str(STEPS), str(FIRST), str(END), RATE]
            for r in range(WORLD)
        ]
        logs = [tmp_path / f"r{r}.log" for r in range(WORLD)]
        run_in_hosts(c, argvs, envs, logs, 200)
    finally:
        c.close()
    reports = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(WORLD)]
    assert reports[0]["history"] == reports[1]["history"]  # alike on every rank, every step
    assert all(r["fallbacks"] == 0 for r in reports), reports
    # one bucket; hist[k]: what step k's numbers decided (lag 1: step k + 2's choice), so
    # every step's numbers but the last's
    hist = [h["0"] for h in reports[0]["history"]]
    assert len(hist) == STEPS - 1

    def mean(lo: int, hi: int) -> float:  # decisions from the numbers of steps lo..hi-1
        return float(np.mean([density(x) for x in hist[lo:hi]]))

    before, during, after = mean(2, FIRST - 1), mean(FIRST + 4, END - 1), mean(END + 6, STEPS)
    assert before > 0.9, hist  # the exact codec hides the aggregation on the fast link
    assert during < 0.6 * before, hist  # compressed while the link is slow
    assert after > 1.5 * during and after > 0.8, hist  # and back after it
    assert any(x not in ("host", "lossless", "fixed_point") for x in hist), hist
