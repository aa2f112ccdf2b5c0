"""bench.training: runs alternate between rounds (order and gloo first or last), the rows of
several codecs and targets, and the targets judged from medians with the reason of a miss
measured (where the switch iteration's time goes, retransmissions)."""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench import training
from homagg.wire.constants import AGG_FRAME_BYTES


def _args(**kw: object) -> Namespace:
    a = Namespace(hosts=4, steps=5, timeout=0, codecs="fixed_point,lowbit8", targets="refswitch")
    a.__dict__.update(kw)
    a.codec_list = a.codecs.split(",")
    a.target_list = a.targets.split(",")
    a.row_names = [
        training.run_name(c, t, a.target_list) for t in a.target_list for c in a.codec_list
    ]
    return a


def _steps(seconds: float, n: int = 5, **hook: float) -> list[dict]:
    return [
        {"loss": 1.0, "seconds": seconds, "tx_bytes": 500, "dense_bytes": 1000, **hook}
        for _ in range(n)
    ]


def test_rounds_alternate_order_and_gloos_place():
    args = _args(targets="bmv2,bmv2-opt")
    even = training.round_specs("mlp", 0, args)
    odd = training.round_specs("mlp", 1, args)
    assert [n for n, _ in even] == [
        "switch, fixed_point (bmv2)",
        "switch, lowbit8 (bmv2)",
        "switch, fixed_point (bmv2-opt)",
        "switch, lowbit8 (bmv2-opt)",
    ]
    assert [n for n, _ in odd] == [n for n, _ in reversed(even)]
    assert [s.gloo for _, s in even] == [True, False, False, False]
    assert [s.gloo for _, s in odd] == [True, False, False, False]
    assert not any(s.peers_first for _, s in even) and all(s.peers_first for _, s in odd)
    assert {s.target for _, s in even} == {"bmv2", "bmv2-opt"}
    # one target: rows without the target's name
    assert [n for n, _ in training.round_specs("lm", 0, _args())] == [
        "switch, fixed_point",
        "switch, lowbit8",
    ]


HOOK = {  # a 300 ms lowbit8 iteration: 50 compute + 250 in the hook, mostly waiting
    "switch_seconds": 0.24,
    "encode_seconds": 0.01,
    "wait_seconds": 0.22,
    "decode_seconds": 0.01,
    "agreement_seconds": 0.01,
    "retransmissions": 4,
    "agg_wire": 20 * AGG_FRAME_BYTES,
}


@pytest.mark.parametrize("lowbit8_s, verdict", [(0.075, "MET"), (0.3, "MISSED")])
def test_the_8_bit_target_is_judged_and_a_miss_explained(lowbit8_s, verdict):
    args = _args()
    tally = training.Tally()
    tally.targets.add("refswitch")
    tally.add("mlp", training.GLOO, _steps(0.1))
    tally.add("mlp", "switch, fixed_point", _steps(0.4, **HOOK))
    tally.add("mlp", "switch, lowbit8", _steps(lowbit8_s, **HOOK))
    line = training.summary_of(["mlp"], args, tally)
    speed = 0.1 / lowbit8_s
    assert line.startswith("training W=4 (refswitch), speed vs DDP over gloo: mlp: ")
    assert f"fixed_point 0.25x, lowbit8 {speed:.2f}x" in line
    assert f"target 8-bit lanes >= 1.3x: {verdict} ({speed:.2f}x" in line
    if verdict == "MISSED":
        assert "gloo 100 ms; the switch's mean iteration is compute 50 ms + hook 250 ms" in line
        assert "waiting on the switch 220 ms" in line
        assert "4.0 retransmissions per step, 5% of the packets" in line
    rows = "\n".join(training.table(["mlp"], args, tally))
    assert "| 4 | MLP (dense) | DDP over gloo | 100 [100, 100] | 1.00x | - | - | 0.50x |" in rows
    assert "| 4 | MLP (dense) | switch, fixed_point | 400 [400, 400] | 0.25x " in rows
    # compute is what the hook's switch work and agreements leave of the iteration
    assert "| 150 + 250 (enc 10, wait 220, dec 10, agree 10) | 4.0 (5%) | 0.50x |" in rows


def test_ncf_target_only_when_lossless_runs():
    args = _args(codecs="lossless")
    tally = training.Tally()
    tally.add("ncf", training.GLOO, _steps(0.5))
    tally.add("ncf", "switch, lossless", _steps(0.1))
    assert "(target lossless >= 4x: MET (5.00x))" in training.summary_of(["ncf"], args, tally)
    assert "target" not in training.summary_of(["ncf"], _args(codecs="fixed_point"), tally)
