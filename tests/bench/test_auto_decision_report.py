"""bench.auto_decision's tables from given times and counts, and its decision cells."""

from __future__ import annotations

from bench.auto_decision import BUCKETS, WAYS, decision_cells, report


def test_the_report_gives_percentiles_ratios_and_counts_per_step():
    times = {
        WAYS[0]: [0.0005] * 100,
        WAYS[1]: [0.002] * 100,
        "gloo": [0.040] * 10,
        "switch": [0.032] * 10,
        "gloo per step": [2.0, 0.0, 2.0],
        "switch per step": [1.0, 1.0, 2.0],
        "gloo fallbacks": [0.0],
        "switch fallbacks": [0.0],
    }
    rows = [x for x in report({"ebpf": times}, world=4, rounds=2) if x.startswith("| ebpf")]
    assert rows[0] == "| ebpf | switch packet | 0.50 | 0.50 | 4.00x | 100 |"
    assert rows[1] == "| ebpf | gloo MAX | 2.00 | 2.00 | 1.00x | 100 |"
    assert rows[2] == "| ebpf | gloo | 40.0 | 40.0 | 1.00x | 10 | 2.00 | 0.00 | 2.00 | 0 |"
    assert rows[3] == "| ebpf | switch | 32.0 | 32.0 | 1.25x | 10 | 1.00 | 1.00 | 2.00 | 0 |"


def test_a_decision_is_one_packet_of_int32_cells_per_rank():
    cells = decision_cells(4)
    assert len(cells) == 4 and all(c.dtype.name == "int32" for c in cells)
    assert {c.size for c in cells} == {4 * BUCKETS + 1}


def test_the_summary_reads_each_benchmarks_own_ways():
    from bench import agreement, auto_decision

    for mod, what in ((agreement, "verdict"), (auto_decision, "decision")):
        results = {"ebpf": {mod.WAYS[0]: [0.001, 0.003], mod.WAYS[1]: [0.004]}}
        line = agreement.ways_summary(results, what, mod.WAYS)
        assert line == f"ebpf: {what} p50 switch 2.00 ms, gloo 4.00 ms"
