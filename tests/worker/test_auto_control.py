"""codec="auto": the controller's MI/AD rule on given measurements, the codec ladder (a
codec list by name), and two ranks over a gloo-simulated switch with a delay injected for
a window of steps: compression rises with the delay, falls after it, the same on both."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from testnet.processes import run_together
from worker import auto_control
from worker.auto_control import HOST, AutoConfig, AutoController, Choice

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("auto_worker.py")


def step(ctl: AutoController, delay: float, budget: float, index: int = 0) -> str:
    ctl.record(index, delay, budget)
    return ctl.decide([index], ctl.measurements([index]))[index]


def test_overrun_multiplies_compression_and_slack_adds_density_back():
    ctl = AutoController(AutoConfig(min_density=1 / 16, decrease=0.25))
    assert ctl.choice(0) == Choice("lossless")
    labels = [step(ctl, d, 1.0) for d in (2.0, 1.9, 1.8, 1.7)]  # compression pays a little
    assert labels == ["cltk@0.5", "cltk@0.25", "cltk@0.125", "cltk@0.0625"]
    assert step(ctl, 0.8, 1.0) == "cltk@0.0625"  # neither overrun nor slack: kept
    labels = [step(ctl, 0.1, 1.0) for _ in range(4)]
    assert labels == ["cltk@0.312", "cltk@0.562", "cltk@0.812", "lossless"]


def test_at_the_floor_an_overrun_goes_to_the_host_and_probes_the_switch_again():
    ctl = AutoController(AutoConfig(min_density=0.5, probe_every=3))
    assert step(ctl, 2.0, 1.0) == "cltk@0.5"
    assert step(ctl, 1.9, 1.0) == HOST  # the switch cannot win even compressed
    assert ctl.buckets[0].floor_delay == 1.9
    assert [step(ctl, 1.5, 1.0) for _ in range(3)] == [HOST, HOST, "cltk@0.5"]  # probe
    assert step(ctl, 1.9, 1.0) == HOST
    assert step(ctl, 3.0, 1.0) == "cltk@0.5"  # the host got slower than the switch: back


def test_agreed_measurements_are_max_delay_and_min_budget():
    a, b = AutoController(), AutoController()
    a.record(3, 0.5, 1.0)
    b.record(3, 0.1, 0.2)
    agreed = np.maximum(a.measurements([3]), b.measurements([3]))
    assert agreed.tolist() == [0.5, -0.2]
    assert a.decide([3], agreed) == b.decide([3], agreed) == {3: "cltk@0.5"}


def test_codec_list_is_a_parameter_and_fixed_density_codecs_join_by_name(monkeypatch):
    monkeypatch.setitem(auto_control.FIXED_DENSITY, "lowbit16", 0.5)
    monkeypatch.setitem(auto_control.FIXED_DENSITY, "lowbit8", 0.25)
    ctl = AutoController(AutoConfig(codecs=("fixed_point", "lowbit16", "lowbit8", "cltk")))
    assert ctl.codec_at(1.0) == Choice("fixed_point")
    assert ctl.codec_at(0.6) == Choice("lowbit16", 0.5)
    assert ctl.codec_at(0.3) == Choice("lowbit8", 0.25)
    assert ctl.codec_at(0.1) == Choice("cltk", 0.1) and Choice("cltk", 0.1).options() == {
        "ratio": 0.1
    }
    only_fixed = AutoController(AutoConfig(codecs=("lossless", "lowbit8")))
    assert only_fixed.codec_at(0.01) == Choice("lowbit8", 0.25)
    with pytest.raises(ValueError, match="exact"):
        AutoConfig(codecs=("cltk",))


def density(label: str) -> float:
    if label in ("lossless", "fixed_point"):
        return 1.0
    if label == HOST:
        return 0.0
    return float(label.split("@")[1])


def test_two_ranks_raise_compression_with_injected_delay_and_lower_it_after(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    cmds = [
        [
            *(sys.executable, str(WORKER), "--rank", str(r), "--store", str(tmp_path / "s")),
            *("--out", str(tmp_path / f"r{r}.json"), "--steps", "40", "--slow", "8:20"),
        ]
        for r in range(2)
    ]
    done = run_together(cmds, 200, env=env)
    assert all(code == 0 for code, _ in done), "\n".join(out[-3000:] for _, out in done)
    out = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert out[0]["history"] == out[1]["history"]  # every rank decided alike, every step
    assert out[0]["choices"] == out[1]["choices"]
    hist = out[0]["history"]
    assert len(hist) == 39  # no decision after the first step (no budget yet)

    def mean_density(lo: int, hi: int) -> float:
        return float(np.mean([density(v) for h in hist[lo:hi] for v in h.values()]))

    before, during, after = mean_density(1, 7), mean_density(12, 19), mean_density(31, 39)
    assert during < 0.5 * before, (before, during, hist)
    assert after > 2 * during, (during, after, hist)


def test_compression_that_does_not_pay_returns_to_exact_and_probes_later():
    ctl = AutoController(AutoConfig(probe_every=2))
    assert step(ctl, 2.0, 1.0) == "cltk@0.5"  # exact overran: compress
    assert step(ctl, 3.0, 1.0) == "lossless"  # but the lossy delay is worse: back to exact
    assert [step(ctl, 2.0, 1.0) for _ in range(2)] == ["lossless", "lossless"]  # held
    assert step(ctl, 2.0, 1.0) == "cltk@0.5"  # the hold is over: compression is probed again
    assert step(ctl, 1.5, 1.0) == "cltk@0.25"  # now it pays: keep compressing


def test_lane_codecs_are_chosen_by_their_fixed_density():
    ctl = AutoController(AutoConfig(codecs=("fixed_point", "lowbit16", "lowbit8")))
    assert ctl.codec_at(1.0) == Choice("fixed_point")
    assert ctl.codec_at(0.6) == Choice("lowbit16", 0.5)  # the least compressing enough
    assert ctl.codec_at(0.5) == Choice("lowbit16", 0.5)
    assert ctl.codec_at(0.3) == Choice("lowbit8", 0.25)
    assert ctl.codec_at(0.01) == Choice("lowbit8", 0.25)
    lane = ctl.codec_at(0.25)
    assert lane.label == "lowbit8" and lane.options() == {}  # no ratio option for lanes
