"""The peer and regime reports: time to target from the per-step records, the target from
gloo's curve, ratios from medians, and "-" for a method that never reaches the target."""

from __future__ import annotations

from bench import peers, regimes
from bench.runs import smoothed, time_to


def _steps(losses: list[float], seconds: float, dense: int = 1000, sent: int = 500) -> list[dict]:
    return [{"loss": x, "seconds": seconds, "tx_bytes": sent, "dense_bytes": dense} for x in losses]


def test_time_to_sums_the_wall_time_until_the_smoothed_loss_reaches_the_target() -> None:
    steps = _steps([1.0, 1.0, 1.0, 0.0, 0.0], 0.5)
    assert smoothed([s["loss"] for s in steps]) == [1.0, 1.0, 1.0, 0.75, 0.6]
    assert time_to(steps, 0.75) == (2.0, 4)
    assert time_to(steps, 0.5) is None


def test_target_is_gloos_smoothed_loss_at_80_percent() -> None:
    gloo = _steps([float(10 - i) for i in range(10)], 0.1)
    assert peers.target_of(gloo) == smoothed([s["loss"] for s in gloo])[7]


def test_table_ratios_and_unreached_targets() -> None:
    tally = peers.Tally()
    falling = [1.0 - 0.1 * i for i in range(10)]
    runs = {
        "DDP over gloo": _steps(falling, 0.2),
        "gloo-dense": _steps(falling, 0.8, sent=4000),
        "switch, lossless": _steps(falling, 0.1),
        "switch, fixed_point": _steps([1.0] * 10, 0.4),  # never learns
    }
    tally.add("ncf", runs, peers.target_of(runs["DDP over gloo"]))
    table = "\n".join(peers.table(["ncf"], tally))
    assert "| gloo-dense | 800 [800, 800] | 0.25x | 4.00x |" in table
    assert "| switch, lossless | 100 [100, 100] | 2.00x | 0.50x |" in table
    assert "| switch, fixed_point |" in table and "| - (0/1) | 0 | 0% |" in table
    line = peers.summary_of(["ncf"], tally)
    assert line.startswith("ncf: fastest to target switch, lossless")
    assert "switch lossless 0.8 s" in line  # reached at step 8 of 0.1 s


def test_regime_rows_compare_with_gloo_and_the_ring() -> None:
    got = regimes.Samples()
    got.add(8, 0.0, {"DDP over gloo": _steps([1.0] * 4, 0.3, sent=1750)})
    got.add(8, 0.0, {"switch, lossless": _steps([1.0] * 4, 0.1, sent=1000)})
    table = "\n".join(regimes.rows(got, [(8, 0.0)]))
    assert "| 8 | unshaped | DDP over gloo | 300 [300, 300] | 1.00x | 2 | 1.75x | 1.75x |" in table
    assert (
        "| 8 | unshaped | switch, lossless | 100 [100, 100] | 3.00x | 1 | 1.00x | 1.75x |" in table
    )
    assert "fixed_point" not in table  # not measured: no row
