"""codec="auto": the controller's rule on given measurements (the host path measured and kept
while it is cheaper, MI/AD on the switch, exploration paid from a bounded credit), the codec
ladder (a codec list by name), and two ranks over a gloo-simulated switch with a delay
injected for a window of steps: compression rises with the delay, falls after it, the same
on both."""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from homagg.lab.processes import run_together
from homagg.worker.auto.control import HOST, AutoConfig, AutoController, Choice, auto_codecs
from homagg.worker.auto.costs import HOST_PLAN

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("auto_worker.py")
LANES = AutoConfig(lag=0, codecs=auto_codecs(True))


def wire(choice: Choice) -> float:
    """What a choice sends per dense cell in these tests: its nominal density."""
    return 0.0 if choice.method == HOST else choice.density


def step(ctl: AutoController, cost: float, budget: float, index: int = 0, nz: float = 1) -> str:
    """One step of bucket `index` at `cost` seconds (the step's time too): the choice that
    ran; decides the next."""
    ran = ctl.choice(index)
    ctl.record(index, cost, ran, nz, wire(ran))
    before = getattr(ctl, "_before", 0.0)  # a step's time is known one step later
    ctl.decide([index], ctl.measurements([index], {index: budget}, before))
    ctl._before = cost  # type: ignore[attr-defined]
    return ran.label


def host_plan_slow(ctl: AutoController) -> AutoController:
    """The whole-step comparison as if already measured, the host plan slow: the tests of
    the per-bucket rule on the switch."""
    ctl.ledger.refresh = 10**9  # measured long ago, and still valid
    ctl.ledger.times[HOST_PLAN] = deque([(0, 100.0)])
    ctl.ledger.rests[HOST_PLAN] = deque([(0, 100.0)])  # and no overhead to the switch
    return ctl


Costs = Callable[[Choice, int], float]


def simulate(ctl: AutoController, costs: Costs, budget: float, steps: int) -> list[float]:
    """Seconds of each step's bucket when it costs costs(choice, step)."""
    out = []
    for t in range(steps):
        out.append(costs(ctl.choice(0), t))
        step(ctl, out[-1], budget)
    return out


def test_starts_on_the_host_then_measures_the_switch_and_keeps_the_cheaper():
    ctl = AutoController(AutoConfig(lag=0))
    assert step(ctl, 0.2, 0.01) == HOST  # step 0: nothing is known
    assert step(ctl, 1.0, 0.01) == "fixed_point"  # the switch's exact codec, measured once
    labels = [step(ctl, 1.0 if ctl.choice(0).method != HOST else 0.2, 0.01) for _ in range(10)]
    # dearer per bucket: the host path, but for one probe of compression (the cost model
    # expects it to win) that the ledger then pays for
    assert labels.count(HOST) == 9 and labels[-6:] == [HOST] * 6, labels
    fast = AutoController(AutoConfig(lag=0))
    step(fast, 0.2, 0.01)
    labels = [step(fast, 0.05 if fast.choice(0).method != HOST else 0.2, 0.1) for _ in range(7)]
    # the switch hides it; a host step runs while the switch plan's step time is not known
    # yet, then the switch plan runs on: its steps are faster than the host path's
    # buckets alone (no host step can beat it)
    assert labels == ["fixed_point", HOST] + ["fixed_point"] * 5, labels


def test_overrun_multiplies_compression_and_slack_adds_density_back():
    ctl = host_plan_slow(AutoController(AutoConfig(lag=0, min_density=1 / 16, decrease=0.25)))
    step(ctl, 5.0, 1.0)  # the host path: far dearer than the switch below
    labels = [step(ctl, d, 1.0) for d in (2.0, 1.6, 1.3, 1.1)]  # compression pays
    assert labels == ["fixed_point", "cltk@0.5", "cltk@0.25", "cltk@0.125"]
    assert step(ctl, 1.0, 1.0) == "cltk@0.0625"  # at the floor, within the budget: kept
    assert step(ctl, 0.8, 1.0) == "cltk@0.0625"  # neither overrun nor slack: kept
    labels = [step(ctl, 0.1, 1.0) for _ in range(5)]
    assert labels == ["cltk@0.0625", "cltk@0.312", "cltk@0.562", "cltk@0.812", "fixed_point"]


def test_the_host_path_runs_while_it_is_cheaper_and_the_switch_is_probed_within_the_credit():
    cfg = AutoConfig(lag=0, explore=0.1)
    ctl = AutoController(cfg)
    host, switch = 0.2, 0.5  # compression does not pay: every density costs the same
    got = simulate(ctl, lambda c, t: host if c.method == HOST else switch, 0.01, 300)
    labels = [h[0] for h in ctl.history]
    assert labels.count(HOST) > 260  # the host path, but for a few probes
    probes = sum(1 for x in got[3:] if x == switch)
    # every probe after the first two measurements was paid by the credit: at most
    # explore x the time run, plus one overdraft (the probe the model expected to win)
    assert probes * (switch - host) <= cfg.explore * sum(got) + (switch - host), probes
    assert probes >= 2  # and the switch is still probed now and then


@pytest.mark.parametrize("seed", range(12))
def test_never_slower_than_the_host_path_and_near_the_best_arm(seed):
    """Random landscapes (the switch's cost a + b x density, noise, host cost): the total
    time stays within the host path's plus the exploration budget and the first two
    measurements, and the last half of the steps is within 10% of the cheapest arm."""
    rng = random.Random(seed)
    host = rng.uniform(0.05, 0.5)
    fixed, per = rng.uniform(0.0, 2.0) * host, rng.uniform(0.2, 6.0) * host
    cfg = AutoConfig(lag=0, codecs=auto_codecs(rng.random() < 0.5), explore=0.1)
    ctl = AutoController(cfg)

    def cost(c: Choice, t: int) -> float:
        base = host if c.method == HOST else fixed + per * c.density
        return base * rng.uniform(0.97, 1.03)

    steps = 300
    got = simulate(ctl, cost, 0.001, steps)
    first = max(0.0, fixed + per - host) * 1.03  # the exact switch, measured at step 1
    assert sum(got) <= (1 + cfg.explore) * host * 1.03 * steps + first + host, (fixed, per)
    ladder = [2.0**-k for k in range(9) if 2.0**-k >= cfg.min_density]  # what it tries
    best = min(host, min(fixed + per * d for d in ladder))
    tail = got[steps // 2 :]
    assert np.mean(tail) <= 1.1 * best * 1.03 + 0.05 * host, (fixed, per, ctl.history[-5:])


def test_agreed_measurements_are_the_smallest_cost_and_budget():
    a, b = AutoController(AutoConfig(lag=0)), AutoController(AutoConfig(lag=0))
    a.record(3, 0.5, Choice(HOST), 1.0)
    b.record(3, 0.1, Choice(HOST), 0.2, 0.3)
    mine, theirs = a.measurements([3], {3: 1.0}, 0.7), b.measurements([3], {3: 0.2}, 0.9)
    agreed = np.maximum(mine, theirs)  # cost, budget, nonzero, wire, the step before's time
    assert agreed.tolist() == [-0.1, -0.2, 1.0, 0.3, 0.9]
    assert a.decide([3], agreed) == b.decide([3], agreed)
    assert a.agreed[3] == b.agreed[3] == (0.1, 0.2)


def test_the_exact_codec_follows_the_nonzero_share():
    ctl = AutoController(AutoConfig(lag=0))
    for index, nz in ((0, 0.01), (1, 0.9)):  # sparse: lossless; dense: fixed point
        ctl.record(index, 0.2, ctl.choice(index), nz)
    ctl.decide([0, 1], ctl.measurements([0, 1], {0: 0.01, 1: 0.01}))
    assert ctl.choice(0) == Choice("lossless") and ctl.choice(1) == Choice("fixed_point")
    only = AutoController(AutoConfig(lag=0, codecs=("lossless", "cltk")))
    step(only, 0.2, 0.01, nz=0.9)
    assert only.choice(0) == Choice("lossless")


def test_codec_ladder_lanes_by_their_fixed_density_and_cltk_by_wire_density():
    ctl = AutoController(AutoConfig(lag=0, codecs=("fixed_point", "lowbit16", "lowbit8", "cltk")))
    assert ctl.codec_at(1.0) == Choice("fixed_point")
    assert ctl.codec_at(0.6) == Choice("lowbit16", 0.5)  # the least compressing enough
    assert ctl.codec_at(0.5) == Choice("lowbit16", 0.5)
    assert ctl.codec_at(0.3) == Choice("lowbit8", 0.25)
    assert ctl.codec_at(0.1) == Choice("cltk", 0.1)
    assert Choice("cltk", 0.1).options() == {"ratio": 0.05}  # k indices and k values
    lane = ctl.codec_at(0.25)
    assert lane.label == "lowbit8" and lane.options() == {}  # no ratio option for lanes
    only_fixed = AutoController(AutoConfig(lag=0, codecs=("lossless", "lowbit8")))
    assert only_fixed.codec_at(0.01) == Choice("lowbit8", 0.25)
    with pytest.raises(ValueError, match="exact"):
        AutoConfig(lag=0, codecs=("cltk",))


def test_lanes_join_the_default_codecs_only_on_a_switch_that_adds_them():
    assert auto_codecs(False) == ("lossless", "fixed_point", "cltk")
    assert auto_codecs(True) == ("lossless", "fixed_point", "lowbit16", "lowbit8", "cltk")
    ctl = host_plan_slow(AutoController(LANES))
    step(ctl, 5.0, 1.0)
    assert [step(ctl, d, 1.0) for d in (2.0, 1.5, 1.2)] == ["fixed_point", "lowbit16", "lowbit8"]


def test_a_fallback_is_no_measurement_of_the_chosen_path():
    ctl = AutoController(AutoConfig(lag=0))
    step(ctl, 0.2, 0.01)
    ctl.record(0, 9.0, None, 1.0)  # the switch fell back (agreed): gloo's time, not its
    ctl.decide([0], ctl.measurements([0], {0: 0.01}))
    assert "1" not in ctl.buckets[0].costs.costs and ctl.buckets[0].density == 1.0


def density(label: str) -> float:
    if label in ("lossless", "fixed_point", HOST):  # exact, no compression
        return 1.0
    return float(label.split("@")[1])


@pytest.mark.slow
def test_two_ranks_raise_compression_with_injected_delay_and_lower_it_after(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    env["PYTHONFAULTHANDLER"] = "1"  # a crash leaves its Python stacks in the output
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
    # a decision after every step but the last; lag 1: step t's numbers decide step t + 2
    assert len(hist) == 40 - 1
    # every host bucket was all-reduced from the hook, on the thread that runs backward
    for o in out:
        assert o["host_issued"] == o["choices"]["host"] == o["host_buckets"] > 0
        assert o["host_from"] == ["MainThread"]

    def mean_density(lo: int, hi: int) -> float:  # of steps lo..hi-1 (hist[0] is step 2's)
        return float(np.mean([density(v) for h in hist[lo - 2 : hi - 2] for v in h.values()]))

    before, during, after = mean_density(2, 8), mean_density(13, 20), mean_density(32, 40)
    assert during < 0.5 * before, (before, during, hist)
    assert after > 2 * during, (during, after, hist)


def test_slack_climbs_back_past_the_lanes_fixed_densities():
    cfg = AutoConfig(lag=0, codecs=("fixed_point", "lowbit16", "lowbit8"), decrease=0.25)
    ctl = host_plan_slow(AutoController(cfg))
    step(ctl, 5.0, 1.0)  # the host path, far dearer
    assert [step(ctl, d, 1.0) for d in (2.0, 1.5, 1.2)] == ["fixed_point", "lowbit16", "lowbit8"]
    labels = [step(ctl, 0.1, 1.0) for _ in range(5)]  # slack: density 0.25 + 0.25 per step
    assert labels == ["lowbit8", "lowbit16", "lowbit16", "fixed_point", "fixed_point"]


def test_held_it_runs_the_exact_codec_and_learns_nothing_until_released():
    ctl = AutoController(AutoConfig(lag=0))
    ctl.hold()  # DeAR compares its bucket sizes on one path
    assert [step(ctl, 9.0, 0.01, nz=0.9) for _ in range(3)] == ["lossless"] + ["fixed_point"] * 2
    assert ctl.buckets[0].costs.costs == {} and ctl.ledger.credit == 0  # nothing learned
    ctl.release()  # learning afresh, from the exact codec
    assert [step(ctl, c, 0.01) for c in (1.0, 0.2)] == ["fixed_point", HOST]


def test_a_sparse_bucket_is_never_compressed_below_what_lossless_already_sends():
    ctl = AutoController(LANES)
    got = []
    for _ in range(30):  # lossless sends 6% of the dense cells; overrun every step
        ran = ctl.choice(0)
        cost = 0.2 if ran.method == HOST else 0.3
        ctl.record(0, cost, ran, 0.01, 0.06 if ran.method != HOST else 0.0)
        ctl.decide([0], ctl.measurements([0], {0: 0.01}, cost))
        got.append(ran.label)
    assert set(got) <= {HOST, "lossless"}, got  # no lossy codec sends fewer cells


def test_an_exploration_pays_its_step_excess_and_waits_while_the_ledger_is_overdrawn():
    """The step's agreed time, not the bucket's cost, pays: a probe whose bucket looks
    cheap but whose step took long (the switch's other costs) overdraws the ledger, and
    nothing is explored again until `explore` x the steps' time has repaid it."""
    cfg = AutoConfig(lag=0, explore=0.1)
    ctl = AutoController(cfg)
    times, labels = [], []
    before = 0.0
    for _ in range(60):
        ran = ctl.choice(0)
        bucket = 0.1 if ran.method == HOST else 0.05  # the switch looks twice as cheap
        step_time = 0.2 if ran.method == HOST else 1.2  # but its steps take 1 s longer
        ctl.record(0, bucket, ran, 1.0, wire(ran))
        ctl.decide([0], ctl.measurements([0], {0: 0.01}, before))
        before = step_time
        times.append(step_time)
        labels.append(ran.label)
    switch_steps = sum(1 for x in labels if x != HOST)
    assert switch_steps <= 2 + cfg.explore * sum(times) / 1.0, labels
    assert labels[-10:].count(HOST) >= 8, labels  # the host path, nearly always


def test_explorations_that_keep_losing_back_off():
    ctl = AutoController(AutoConfig(lag=0, explore=0.1))
    before, probes = 0.0, []
    for t in range(300):  # the switch looks cheaper per bucket, its steps are 50% slower
        ran = ctl.choice(0)
        on_switch = ran.method != HOST
        ctl.record(0, 0.05 if on_switch else 0.1, ran, 1.0, wire(ran))
        ctl.decide([0], ctl.measurements([0], {0: 0.01}, before))
        before = 0.3 if on_switch else 0.2
        if on_switch:
            probes.append(t)
    gaps = [b - a for a, b in itertools.pairwise(probes[2:])]
    assert len(probes) <= 12 and all(b > a for a, b in itertools.pairwise(gaps)), probes
