"""DeAR mode: two ranks (subprocesses, gloo) end at DDP's parameters with SGD + momentum and
with Adam, with the bucket size tuned on the first iterations; the tuner's rule."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from homagg.lab.processes import run_together
from homagg.worker.ddp.bucket_tuner import BucketTuner

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dear_worker.py")


@pytest.mark.slow
def test_dear_over_gloo_ends_at_ddp_parameters(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    cmds = [
        [
            *(sys.executable, str(WORKER), "--rank", str(r), "--world", "2"),
            *("--store", str(tmp_path / "store"), "--out", str(tmp_path / f"r{r}.pt")),
        ]
        for r in range(2)
    ]
    done = run_together(cmds, 240, env=env)
    assert all(code == 0 for code, _ in done), "\n".join(out[-3000:] for _, out in done)
    ranks = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    for res in ranks:
        for opt in ("sgd", "adam", "sgd-sparse"):
            for k, v in res[f"ddp-{opt}"].items():
                torch.testing.assert_close(res[f"dear-{opt}"][k], v, atol=1e-6, rtol=1e-5)
    for k, v in ranks[0]["dear-adam"].items():
        torch.testing.assert_close(ranks[1]["dear-adam"][k], v, atol=0, rtol=0)
    infos = [json.loads((tmp_path / f"r{r}.pt.json").read_text()) for r in range(2)]
    assert infos[0] == infos[1]  # the same agreed choice on both ranks
    assert infos[0]["sgd"]["chosen"] in (512, 2048, 8192)
    assert len(infos[0]["sgd"]["report"]) == 3


def agree_identity(times: list[float]) -> list[float]:
    return times


def drive(tuner: BucketTuner, per_size: dict[int, float], iterations: int) -> list[int]:
    """Iterations whose duration depends on the size in use; the sizes switched to."""
    now, switched = 0.0, []
    for _ in range(iterations):
        new = tuner.on_iteration(now, agree_identity)
        if new is not None:
            switched.append(new)
        now += per_size[tuner.current]
    return switched


def test_tuner_measures_each_candidate_and_keeps_the_fastest():
    tuner = BucketTuner([1000, 4000, 16000], model_bytes=100_000, steps=2)
    switched = drive(tuner, {1000: 0.3, 4000: 0.1, 16000: 0.2}, 20)
    assert switched == [4000, 16000, 4000] and tuner.chosen == 4000
    assert tuner.report() == pytest.approx({1000: 0.3, 4000: 0.1, 16000: 0.2})


def test_tuner_skips_sizes_beyond_one_bucket_and_a_fixed_size_is_not_tuned():
    tuner = BucketTuner([1000, 4000, 16000, 64000], model_bytes=3000, steps=1)
    assert tuner.candidates == [1000, 4000]
    fixed = BucketTuner([5000], model_bytes=100_000)
    assert fixed.chosen == 5000 and drive(fixed, {5000: 0.1}, 5) == []
    with pytest.raises(ValueError):
        BucketTuner([], 10)
