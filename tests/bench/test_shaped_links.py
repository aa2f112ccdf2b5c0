"""bench.shaped_links: a point's ratios, goodput, bounds and verdicts from its steps."""

from __future__ import annotations

import pytest

from bench import shaped_links
from bench.link_physics import link_bound

N = 256 * 1000


def _step(secs: float, packets: int = 1010, cpu: float = 1.0) -> dict[str, float]:
    return {"secs": secs, "packets": packets, "retx": 0, "cpu": cpu, "load": 2.0}


def _record(switch_s: float, gloo_s: float) -> dict:
    rec: dict = {}
    for mbit in (0.0, 100.0):
        rec[(4, mbit, N, "gloo")] = [_step(gloo_s), _step(gloo_s * 3)]
        rec[(4, mbit, N, "switch")] = [_step(switch_s), _step(switch_s * 3)]
    return rec


def test_point_ratios_goodput_and_bounds():
    p = shaped_links.point(_record(0.1, 0.2), 4, 100.0, N)
    assert p["speedup"] == pytest.approx(2.0)  # medians of 2 steps: the means
    assert p["goodput"] == pytest.approx(N * 32 / 0.2 / 1e6)
    assert p["share"] == pytest.approx(p["goodput"] / 100)
    bound = link_bound(N, 4, 100.0, switch_packets=1010)
    assert p["ideal_ratio"] == pytest.approx(bound.ratio)
    assert p["ideal_share"] == pytest.approx(bound.switch_goodput_share)
    assert p["cpu_pps"] == pytest.approx(1010 / 0.2)
    # 1 s of CPU for 4 workers x 1010 packets
    assert p["us_per_packet"] == pytest.approx(1e6 / (4 * 1010))
    unshaped = shaped_links.point(_record(0.1, 0.2), 4, 0.0, N)
    assert "ideal_ratio" not in unshaped and "share" not in unshaped


@pytest.mark.parametrize(("switch_s", "verdict"), [(0.01, "MET"), (0.5, "MISSED")])
def test_verdicts_need_both_the_ratio_and_the_goodput(switch_s, verdict):
    (line,) = shaped_links.verdicts(_record(switch_s, 0.2), [4], [100.0], N)
    assert line.endswith(verdict)


def test_fast_but_not_enough_ahead_of_gloo_is_missed():
    # goodput at the link's rate, but gloo as fast: 1.0x < 1.3x
    secs = N * 32 / 95e6
    (line,) = shaped_links.verdicts(_record(secs, secs), [4], [100.0], N)
    assert "1.00x gloo" in line and line.endswith("MISSED")
