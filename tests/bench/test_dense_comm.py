"""bench.dense_comm: its settings and the communication it sets side by side."""

from __future__ import annotations

import math

import pytest

from bench.dense_comm import GLOO, SWITCH, Setting, comm_seconds, parse_settings, summarize


def test_settings_parse_models_and_batches():
    assert parse_settings("mlp,lm,lm:8") == [Setting("mlp"), Setting("lm"), Setting("lm", 8)]
    assert Setting("lm", 8).label == "lm, batch 8"


@pytest.mark.parametrize("text", ["ncf", "lm:x", "lm:2", "lm:-8", ""])
def test_bad_settings_say_the_form(text):
    with pytest.raises(ValueError, match=r"MODEL|BATCH"):
        parse_settings(text)


def test_communication_of_each_method():
    step = {"allreduce_seconds": 0.2, "switch_seconds": 0.1, "agreement_seconds": 0.05}
    assert comm_seconds(step, GLOO) == 0.2
    assert comm_seconds(step, SWITCH) == pytest.approx(0.15)


def test_ratios_are_gloo_over_switch_of_the_medians():
    gloo = [{"seconds": s, "allreduce_seconds": c} for s, c in ((1.0, 0.6), (3.0, 0.8), (2.0, 2))]
    sw = [{"seconds": 1.0, "switch_seconds": 0.4, "agreement_seconds": 0.0}] * 3
    got = summarize({GLOO: gloo, SWITCH: sw})
    assert got["step ratio"] == pytest.approx(2.0)
    assert got["comm ratio"] == pytest.approx(2.0)
    none = summarize({GLOO: gloo, SWITCH: [{"seconds": 1.0}]})
    assert math.isnan(none["comm ratio"])
