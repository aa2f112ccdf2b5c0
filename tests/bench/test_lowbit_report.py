"""bench.lowbit: every lane run through `python -m run` with its codec options (the regime's
and gamma / rounding), and the 16-bit target judged from the final losses."""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench import lowbit


def _args() -> Namespace:
    return Namespace(hosts=4, target="refswitch", regime=lowbit.REGIMES, rounds=1, name="x")


def test_runs_carry_the_regime_and_their_own_options():
    specs = lowbit.specs("mlp", _args())
    names = [n for n, _ in specs]
    assert names == [n for n, _, _ in lowbit.RUNS]
    by_name = dict(specs)
    r = lowbit.REGIMES["mlp"]
    assert [s.gloo for _, s in specs] == [True] + [False] * (len(specs) - 1)
    for spec in by_name.values():
        assert (spec.steps, spec.lr, spec.batch) == (r.steps, r.lr, r.batch)
        assert spec.codec_options[: len(r.options)] == r.options
    assert by_name["8-bit lanes, no EF"].switch_run == "switch, lowbit8 block=131072 gamma=0"
    nearest = by_name["8-bit nearest, no EF"]
    assert nearest.codec_options[-2:] == ["rounding=nearest", "gamma=0"]
    assert by_name["16-bit lanes + EF"].codec == "lowbit16"


@pytest.mark.parametrize("d16, verdict", [(1.005, "MET"), (1.02, "MISSED")])
def test_the_16_bit_target_is_judged_on_the_final_losses(d16, verdict):
    steps = 50
    curves = {("lm", lowbit.GLOO): [[2.0] * steps]}
    factor = {
        "16-bit lanes + EF": d16,
        "8-bit lanes + EF": 1.0,
        "8-bit lanes, no EF": 1.001,
        "8-bit nearest + EF": 1.003,
        "8-bit nearest, no EF": 1.05,
    }
    for name, f in factor.items():
        curves[("lm", name)] = [[3.0] * (steps - 5) + [2.0 * f] * 5]  # only the end counts
    rows, part = lowbit.verdicts("lm", curves)
    assert f"16-bit {100 * (d16 - 1):+.2f}% (target within 1% of gloo: {verdict})" in part
    assert "8-bit rounding to nearest +0.30% / without feedback +5.00%" in part
    assert "| transformer LM (dense) | 8-bit nearest, no EF | 2.1000 | +5.00% |" in rows
    assert lowbit.final_loss([5.0] * 90 + [1.0] * 10) == 1.0  # the last tenth
