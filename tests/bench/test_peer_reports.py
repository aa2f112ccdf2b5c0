"""The peer and regime reports: time to target from the per-step records, the target from
gloo's curve, ratios from medians, "-" for a method that never reaches the target, where a
switch iteration's time goes, and the peers' part of make bench's summary line."""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench import peers, regimes, summary
from bench.runs import retransmissions, smoothed, split_cell, time_split, time_to
from homagg.wire.constants import AGG_FRAME_BYTES


def _steps(losses: list[float], seconds: float, dense: int = 1000, sent: int = 500) -> list[dict]:
    return [{"loss": x, "seconds": seconds, "tx_bytes": sent, "dense_bytes": dense} for x in losses]


def _switch_steps(losses: list[float], seconds: float, **hook: float) -> list[dict]:
    """Switch records: the hook's time split and retransmissions as run/train.py writes."""
    return [{**s, **hook} for s in _steps(losses, seconds)]


HOOK = {  # of a 0.1 s iteration: 20 ms compute, 80 ms in the hook
    "switch_seconds": 0.075,
    "encode_seconds": 0.005,
    "wait_seconds": 0.06,
    "decode_seconds": 0.01,
    "agreement_seconds": 0.005,
    "retransmissions": 3,
    "agg_wire": 6 * AGG_FRAME_BYTES,  # per rank: 6 frames, 24 with 4 ranks
}


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
        "switch, lossless": _switch_steps(falling, 0.1, **HOOK),
        "switch, fixed_point": _steps([1.0] * 10, 0.4),  # never learns
    }
    tally.add("ncf", runs, peers.target_of(runs["DDP over gloo"]))
    table = "\n".join(peers.table(["ncf"], tally, hosts=4))
    assert "| gloo-dense | 800 [800, 800] | 0.25x | 4.00x |" in table
    assert "| gloo-dense |" in table and table.count("| - | - | - | - |") == 2  # no hook
    assert "| switch, lossless | 100 [100, 100] | 2.00x | 0.50x |" in table
    # where the switch's time goes: 20 ms compute + 80 ms hook, 60% waiting, 3 of 24 resent
    assert "| 0 | 20 + 80 (enc 5, wait 60, dec 10, agree 5) | 60% | 3.0 (12%) |" in table
    assert "| switch, fixed_point |" in table and "| - (0/1) | 0 | - | 0% | 0.0 (0%) |" in table
    line = peers.summary_of(["ncf"], tally, hosts=4)
    assert line.startswith("ncf: fastest to target switch, lossless")
    assert "switch lossless 0.8 s" in line  # reached at step 8 of 0.1 s
    assert "(waiting on the switch 60% of its iteration, 3.0 retransmissions per step)" in line


def test_time_split_adds_up_to_the_mean_iteration() -> None:
    timed = _switch_steps([1.0] * 3, 0.1, **HOOK)
    split = time_split(timed)
    assert split == pytest.approx(
        {"compute": 0.02, "encode": 0.005, "wait": 0.06, "decode": 0.01, "agreement": 0.005}
    )
    assert sum(split.values()) == pytest.approx(0.1)
    # hook time the transport did not split (codec set-up) counts as encoding
    more = time_split(_switch_steps([1.0], 0.1, **{**HOOK, "switch_seconds": 0.085}))
    assert more["encode"] == pytest.approx(0.015) and more["compute"] == pytest.approx(0.01)
    assert time_split(_steps([1.0] * 2, 0.3)) == pytest.approx(
        {"compute": 0.3, "encode": 0.0, "wait": 0.0, "decode": 0.0, "agreement": 0.0}
    )
    assert split_cell(time_split(_steps([1.0], 0.3))) == "-"
    assert retransmissions(timed, 4) == pytest.approx((3.0, 0.125))


def test_summary_line_carries_the_peers_part(tmp_path, monkeypatch, capsys) -> None:
    """make bench's one line ends with bench.peers' summary, read from what it wrote."""
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    monkeypatch.setattr("bench.publish.RESULTS", tmp_path)
    tally = peers.Tally()
    falling = [1.0 - 0.1 * i for i in range(10)]
    for m in ("ncf", "mlp"):
        runs = {
            "DDP over gloo": _steps(falling, 0.2),
            **{p: _steps(falling, 0.3) for p in peers.PEERS_OF[m]},
            "switch, lossless": _switch_steps(falling, 0.1, **HOOK),
            "switch, fixed_point": _steps([1.0] * 10, 0.4),
        }
        tally.add(m, runs, peers.target_of(runs["DDP over gloo"]))
    args = Namespace(steps=10, rounds=1, hosts=4, bw=0.0, name="peers", failed=[])
    peers.write(args, ["ncf", "mlp"], tally, "bmv2", 60.0, 1)
    assert summary.main(["60"]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out.startswith("bench: ") and "; peers W=4 (bmv2, unshaped): ncf: fastest" in out
    assert "mlp: fastest to target switch, lossless 0.8 s" in out
    assert "waiting on the switch 60% of its iteration, 3.0 retransmissions per step" in out


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


def test_run_command_and_its_time_budget_scale_with_the_steps(tmp_path) -> None:
    """A job's timeout grows with its steps (BENCH=full's 40-step runs of 8 s steps would
    not fit a fixed 300 s); the options reach python -m run."""
    from bench.runs import RunSpec, job_timeout, run_command

    assert job_timeout(40) > 40 * 8.2 + 60 and job_timeout(40) > job_timeout(10)
    spec = RunSpec("mlp", "lowbit8", steps=40, gloo=False, codec_options=["gamma=0"])
    spec.peers_first, spec.lr, spec.batch, spec.pool_size = True, 0.5, 128, 64
    cmd = run_command(spec, tmp_path)
    assert cmd[cmd.index("--pool-size") + 1] == "64"
    assert "--pool-size" not in run_command(RunSpec("mlp"), tmp_path)  # run's default
    assert cmd[cmd.index("--timeout") + 1] == f"{job_timeout(40):g}"
    assert cmd[cmd.index("--codec-option") + 1] == "gamma=0" and "--peers-first" in cmd
    assert cmd[cmd.index("--lr") + 1] == "0.5" and cmd[cmd.index("--batch") + 1] == "128"
    assert "--no-gloo" in cmd and spec.switch_run == "switch, lowbit8 gamma=0"
    fixed = RunSpec("mlp", timeout=60.0, steps=40)
    assert run_command(fixed, tmp_path)[run_command(fixed, tmp_path).index("--timeout") + 1] == "60"
