"""End to end in Mininet (2 hosts, the reference switch, the dense MLP, 12 steps): `python
-m run --codec auto` measures the host path and the switch's exact codec and prints its
choices, alike on every rank, with the asynchronous hook and in DeAR mode; `--overlap dear`
tunes its bucket size, prints it with the time of every size tried, and ends with gloo's
parameters within the fixed-point bound (the three runs started together: conftest.py's
auto_runs)."""

from __future__ import annotations

import json

import pytest
from mininet_runs import mininet_reason

pytestmark = pytest.mark.skipif(
    bool(mininet_reason()), reason=mininet_reason() or "runs make run in Mininet"
)


@pytest.mark.timeout(420)
def test_codec_auto_prints_its_choices_alike_on_every_rank(auto_runs):
    run = auto_runs["auto"]
    text = run.output()
    assert "codec auto, overlap async" in text, text[-2000:]
    line = next(x for x in text.splitlines() if x.startswith("auto codec choices"))
    assert "host " in line, line  # step 0 measures the host path
    assert "fixed_point" in line, line  # step 2 the switch's exact codec (dense bucket)
    # a decision from every step's numbers but the last's (pipelined: they decide step + 2)
    assert "auto decisions of 11 steps on 2 ranks: alike on every rank" in text, text[-2000:]
    histories = [json.loads(p.read_text()) for p in sorted(run.out.glob("auto-rank*.json"))]
    assert len(histories) == 2 and histories[0][0] == {"0": "fixed_point"}, histories


@pytest.mark.timeout(420)
def test_dear_tunes_its_bucket_size_and_ends_at_gloos_parameters(auto_runs):
    run = auto_runs["dear"]
    text = run.output()
    line = next(x for x in text.splitlines() if x.startswith("DeAR bucket size"))
    assert "(tuned; iteration by size: 256 KiB " in line and "1024 KiB" in line, line
    assert "AGREE within the bound" in text, text[-2000:]
    steps = [json.loads(x) for x in (run.out / "switch.jsonl").read_text().splitlines()]
    assert len(steps) == 12 and all(s["fallback_buckets"] == 0 for s in steps)


@pytest.mark.timeout(420)
def test_codec_auto_in_dear_mode_starts_after_the_tuning(auto_runs):
    text = auto_runs["auto-dear"].output()
    assert "codec auto, overlap dear" in text, text[-2000:]
    assert "DeAR bucket size" in text and "(tuned; iteration by size" in text, text[-2000:]
    line = next(x for x in text.splitlines() if x.startswith("auto codec choices"))
    assert "host " in line and "fixed_point" in line, line
    assert "auto decisions of 11 steps on 2 ranks: alike on every rank" in text, text[-2000:]
