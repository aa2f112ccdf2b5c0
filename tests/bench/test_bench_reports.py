"""The benchmark reports: ratios come from the recorded medians, the targets are judged
from them, and `make bench`'s one-line summary reads what the parts wrote."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest

from bench import aggregation, summary


def _record(fixed_s: float, lossless_s: float) -> dict:
    rec = {}
    for w in aggregation.WORLD_SIZES:
        rec[("refswitch", 1000, w, "gloo", None)] = {"secs": [0.001, 0.002, 0.003], "retx": 0}
        rec[("refswitch", 1000, w, "fixed_point", None)] = {
            "secs": [fixed_s, fixed_s * 2, fixed_s / 2],
            "retx": 3,
        }
        for d in aggregation.DENSITIES:
            for m in ("lossless", "cltk"):
                rec[("refswitch", 1000, w, m, d)] = {"secs": [lossless_s] * 3, "retx": 0}
        rec[("refswitch", 1000, w, "lossless_sketch", aggregation.SKETCH_DENSITY)] = {
            "secs": [1.0],
            "retx": 0,
        }
    return rec


@pytest.mark.parametrize("lossless_s, verdict", [(0.09, "MET"), (0.11, "MISSED")])
def test_aggregation_report_judges_the_target_from_medians(lossless_s, verdict):
    args = Namespace(n=1000, bmv2_n=100, reps=3, bmv2_reps=2)
    lines, line = aggregation.report(_record(1.0, lossless_s), 12.0, args)
    ratio = 1.0 / lossless_s
    assert f"W=2 {ratio:.1f}x, W=4 {ratio:.1f}x (target >= 10x: {verdict})" in line
    table = "\n".join(lines)
    assert (
        "| 2 | switch, dense fixed point | any | 0.00 [0.00, 0.00] | 0.00x | 1.00x | 3 |" in table
    )
    assert "switch, lossless (count sketch) | 1.0% |" in table


def test_summary_line_reads_the_parts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    args = Namespace(n=1000, bmv2_n=100, reps=3, bmv2_reps=2)
    lines, _ = aggregation.report(_record(1.0, 0.05), 12.0, args)
    (tmp_path / "aggregation.md").write_text("\n".join(lines) + "\n")
    (tmp_path / "training.md").write_text(
        "x\n\nSummary: training W=4 (bmv2), speed vs DDP over gloo: ncf: lossless 4.50x.\n"
    )
    assert summary.main(["90"]) == 0
    out = capsys.readouterr().out
    assert "1.5 min" in out and "W=2 20.0x, W=4 20.0x (target >= 10x: MET)" in out
    assert "ncf: lossless 4.50x" in out


def _overlap_steps(ms: float, n: int, agg_ms: float = 100.0, **extra: Any) -> list[dict]:
    half = agg_ms / 2e3
    return [
        {"seconds": ms / 1e3, "switch_seconds": half, "agreement_seconds": half, "loss": 1.0}
        | extra
        for _ in range(n)
    ]


def _overlap_tally(setting: Any, auto_ms: float, block_ms: float, agg_ms: float) -> Any:
    from bench import overlap

    t = overlap.Tally(targets={"refswitch"})
    t.add(setting, overlap.GLOO, _overlap_steps(100.0, 6))
    t.add(setting, "switch, blocking", _overlap_steps(block_ms, 6, agg_ms))
    t.add(setting, "switch, async", _overlap_steps(block_ms - agg_ms / 4, 6))
    dear = _overlap_steps(500.0, 3, dear_bucket_bytes=1, dear_tuned=False)
    dear += _overlap_steps(block_ms - agg_ms * 0.6, 4, dear_bucket_bytes=1, dear_tuned=True)
    t.add(setting, "DeAR", dear)  # its tuning steps are not timed
    t.add(setting, "auto", _overlap_steps(auto_ms, 6))
    t.add(setting, "auto, DeAR", _overlap_steps(auto_ms * 2, 5, dear_bucket_bytes=1))
    return t


def test_overlap_report_judges_the_targets_from_the_medians():
    from bench import overlap

    heavy = overlap.Setting("lm", 5.0, 1024)
    t = _overlap_tally(heavy, auto_ms=95.0, block_ms=400.0, agg_ms=200.0)
    assert t.split(heavy) == (200.0, 200.0)  # compute = aggregation: the target applies
    assert t.hidden(heavy, "DeAR") == pytest.approx(0.6)  # tuning steps left out
    lines = overlap.judge(heavy, t)
    assert "auto 1.05x gloo (never slower: MET" in lines[0]
    assert "0.95 x the best fixed choice, DDP over gloo (within 10%: MET)" in lines[0]
    assert "auto, DeAR 0.53x gloo (never slower: MISSED" in lines[1]  # not tuned: all timed
    assert "switch, async hides 25% (compute 200 ms, aggregation 200 ms; >= 50% where " in lines[2]
    assert lines[2].endswith("MISSED)") and lines[3].endswith("MET)")
    slow = overlap.Setting("ncf")
    t = _overlap_tally(slow, auto_ms=120.0, block_ms=150.0, agg_ms=140.0)
    lines = overlap.judge(slow, t)
    assert "(never slower: MISSED" in lines[0] and "(within 10%: MISSED)" in lines[0]
    assert "NCF 1.52x gloo (DeAR; >= 6x: MISSED)" in lines[2]
    assert lines[3].endswith("not applicable)")  # compute 10 ms < aggregation 140 ms
    table = "\n".join(overlap.table([slow], t))
    assert "| ncf, unshaped | auto | 120 [120, 120] | 120 | 0.83x | 21% | 1.0000 |" in table
    assert "overlap (refswitch): ncf, unshaped: auto 0.83x gloo, 1.82 x best, auto, DeAR" in (
        overlap.summary_of([slow], t)
    )


def test_overlap_table_reports_a_run_that_stopped_early():
    from bench import overlap

    s = overlap.Setting("lm", 100.0)
    t = _overlap_tally(s, 90.0, 300.0, 100.0)
    t.runs[(s, "DeAR")] = [_overlap_steps(150.0, 1)]  # only the untimed first step
    rows = overlap.table([s], t)
    assert any("| DeAR | stopped after 1 steps |" in x for x in rows)
    assert "not every mode was timed" in overlap.judge(s, t)[0]
    assert overlap.Setting.parse("lm:1024:5") == overlap.Setting("lm", 5.0, 1024)
    assert overlap.Setting.parse("mlp") == overlap.Setting("mlp")


def test_summary_reads_the_packet_rate_ratios_and_the_full_results_first(tmp_path, monkeypatch):
    from bench import switch_rate

    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    row = {"cells": 256, "op": "ADD", "rates": {"refswitch": [400.0], "bmv2": [100.0]}}
    (tmp_path / "switch_rate.md").write_text("\n".join(switch_rate.ratio_rows(row)) + "\n")
    assert "refswitch / BMv2 packet rate (256 cells): 4.00x" in summary.line(60)
    assert "optimized" not in summary.line(60)
    row["rates"]["bmv2-opt"] = [150.0]
    (tmp_path / "switch_rate.md").write_text("\n".join(switch_rate.ratio_rows(row)) + "\n")
    assert (
        switch_rate.ratio_rows(row)[1] == "| 256 | ADD | bmv2-opt / bmv2 | 1.50x | | | | 1 Python |"
    )
    assert "optimized / default BMv2 packet rate (256 cells): 1.50x" in summary.line(60)
    (tmp_path / "training.md").write_text("Summary: quick training.\n")
    (tmp_path / "training_full.md").write_text("Summary: full training.\n")
    (tmp_path / "lowbit_full.md").write_text("Summary: convergence.\n")
    assert "quick training" in summary.line(60) and "convergence" not in summary.line(60)
    full = summary.line(60, "_full")
    assert "full training" in full and "convergence" in full  # full first, quick otherwise
    assert "4.00x" in full


def _straggler_row(seconds: float, retx: int, error: str = "") -> dict:
    return {
        "seconds": seconds,
        "retx": retx,
        "probes": 3,
        "fell_back": int(bool(error)),
        "exact": not error,
        "error": error,
    }


def test_straggler_report_spreads_the_repetitions_and_names_why_steps_ended():
    from bench import straggler

    lease = "job 3 has ended: lease of rank 1 expired (no heartbeat for 3 s)"
    rows = {
        "pause": [_straggler_row(10.0, 25), _straggler_row(10.2, 23)],
        "pause, no wait": [_straggler_row(3.6, 12, "then no evidence that the peers")] * 2,
        "killed": [_straggler_row(3.2, 10, lease), _straggler_row(3.9, 12, "other")],
    }
    table = "\n".join(straggler.report({"bmv2": rows}, 2, 10.0))
    assert (
        "| bmv2 | rank 1 pauses 10 s | 10.1 [10.0, 10.2] | 24 [23, 25] | 3 [3, 3] | 0 | yes |"
        in (table)
    )
    assert "| bmv2 | rank 1 killed | 3.5 [3.2, 3.9] | 11 [10, 12] | 3 [3, 3] | 2 | no |" in table
    assert "1.30 x the lease at most (1 of 2 because the controller ended" in table
    assert "fell back on a spent retry budget 2 of 2 times" in table


@pytest.mark.parametrize("batched_pps, verdict", [(120_000.0, "MET"), (20_000.0, "MISSED")])
def test_worker_rate_report_judges_the_target_from_medians(batched_pps, verdict):
    from bench import worker_rate

    args = Namespace(n=1000, reps=3, targets=["refswitch"], world_sizes=[1, 4], profile=False)
    rec = {}
    for w in (1, 4):
        for path, pps in (("python", 10_000.0), ("batched", batched_pps)):
            rec[("refswitch", w, path)] = {
                "secs": [1.0, 2.0, 3.0],
                "pps": [pps / 2, pps, pps * 3],  # the median is pps
                "retx": 1,
                "sent": 1000,
                "user": 0.004,
                "sys": 0.006,
                "bpf_ns": 0,
            }
    lines, line = worker_rate.report(rec, {}, 5.0, args)
    ratio = batched_pps / 10_000.0
    assert f"W=1 {ratio:.1f}x, reference switch W=4 {ratio:.1f}x" in line
    assert f"(target >= 100,000: {verdict})" in line
    assert f"| reference switch | 4 | batched | {batched_pps:,.0f} [" in "\n".join(lines)
    assert "| 4.0 + 6.0 | - | 1 |" in "\n".join(lines)
