"""The tree scaling benchmark's pure half (bench/tree_scaling_report.py), from made-up
measurements (no root, no switch): the layouts it accepts and refuses, the order it runs
them in, the rows' bytes and ratios, the prediction's levels, the table and the summary."""

from __future__ import annotations

import argparse

import pytest

from bench import tree_scaling, tree_scaling_report
from bench.projection_model import BYTES_PER_ELEMENT, Costs, frame_bytes, phase_cells
from bench.tree_scaling_report import Layout, parse_tree, plan, predicted, rows
from homagg.wire.constants import CELLS_PER_PKT

N = 1 << 16
PACKETS = N // CELLS_PER_PKT  # one dense phase: packets a worker sends


def test_parse_tree() -> None:
    lay = parse_tree("4x16")
    assert (lay.workers, lay.kind, lay.leaves, lay.per_leaf, lay.label) == (
        64,
        "tree",
        4,
        16,
        "tree 4x16",
    )
    assert parse_tree("2X1").per_leaf == 1


@pytest.mark.parametrize("text", ["2x", "x4", "2*4", "2x4x1", "-2x4", ""])
def test_parse_tree_refuses_what_is_not_leaves_x_workers(text: str) -> None:
    with pytest.raises(ValueError, match="LEAVESxWORKERS"):
        parse_tree(text)


@pytest.mark.parametrize(
    ("workers", "kind", "leaves", "match"),
    [
        (33, "flat", 1, "at most 32"),  # the seen bitmap: a tree is needed
        (33, "tree", 1, "2..32 leaves"),
        (66, "tree", 2, "2..32 leaves"),  # 33 workers on a leaf
        (66, "tree", 33, "2..32 leaves"),  # 33 leaves under one parent
        (9, "tree", 2, "do not split"),
        (0, "flat", 1, "do not split"),
        (8, "ring", 1, "one of"),
        (8, "flat", 2, "has no leaves"),
    ],
)
def test_layout_refuses(workers: int, kind: str, leaves: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Layout(workers, kind, leaves)


def test_layout_edges_accepted() -> None:
    assert Layout(32, "flat").levels == 1
    assert Layout(1024, "tree", 32).per_leaf == 32
    assert Layout(64, "gloo").levels == 0


def test_plan_runs_each_w_flat_then_tree_then_gloo_once() -> None:
    got = plan([16, 8, 8], [parse_tree("2x4"), parse_tree("2x8")], [16, 8])
    assert [lay.label for lay in got] == [
        "flat 8",
        "tree 2x4",
        "gloo 8",
        "flat 16",
        "tree 2x8",
        "gloo 16",
    ]


def _rec(secs: list[float], packets: int | None = None, rtt: float = 0.0, retx: int = 0) -> dict:
    return {
        "secs": secs,
        "packets": [packets] * len(secs) if packets is not None else [],
        "rtt": [rtt] * len(secs) if rtt else [],
        "retx": retx,
    }


def measured() -> dict[Layout, dict]:
    return {
        Layout(8, "gloo"): _rec([0.010, 0.020, 0.030]),
        Layout(8, "tree", 2): _rec([0.2, 0.4, 0.3], 8 * PACKETS, 400e-6, retx=2),
        Layout(8, "flat"): _rec([0.1, 0.2, 0.15], 8 * PACKETS, 200e-6),
        Layout(64, "tree", 4): _rec([1.0], 64 * PACKETS + 64, 500e-6),
        Layout(64, "gloo"): _rec([0.05]),
    }


def test_rows_bytes_and_ratios() -> None:
    got = {r["layout"].label: r for r in rows(measured(), N)}
    assert list(got) == ["flat 8", "tree 2x4", "gloo 8", "tree 4x16", "gloo 64"]
    per_packet = frame_bytes(CELLS_PER_PKT) / (CELLS_PER_PKT * BYTES_PER_ELEMENT)
    assert got["flat 8"]["bytes_ratio"] == pytest.approx(per_packet)
    assert got["tree 4x16"]["bytes_ratio"] == pytest.approx(per_packet * (PACKETS + 1) / PACKETS)
    assert got["gloo 8"]["bytes_ratio"] == pytest.approx(2 * 7 / 8)
    assert got["gloo 64"]["bytes_ratio"] == pytest.approx(2 * 63 / 64)
    tree = got["tree 2x4"]
    assert tree["secs"] == pytest.approx(0.3)
    assert tree["secs_range"] == (0.2, 0.4)
    assert tree["vs_flat"] == pytest.approx(2.0)
    assert tree["vs_gloo"] == pytest.approx(15.0)
    assert tree["rtt_vs_flat"] == pytest.approx(2.0)
    assert tree["retx"] == 2
    # no flat at W = 64 (it does not fit one switch): no ratio to it
    assert got["tree 4x16"]["vs_flat"] is None and got["tree 4x16"]["rtt_vs_flat"] is None
    assert got["gloo 8"]["vs_flat"] is None and got["gloo 8"]["rtt"] is None


def test_table_and_summary() -> None:
    rows_ = rows(measured(), N)
    lines = tree_scaling_report.table("reference switch", rows_, N)
    assert lines[0].startswith("### reference switch, n = 65,536")
    tree = next(line for line in lines if "| tree 2x4 |" in line)
    assert "| 2.00 | 15.00 | 400 | 2.00 | 2 |" in tree
    gloo = next(line for line in lines if "| gloo 8 |" in line)
    assert gloo.endswith("| - | - | - |")
    line = tree_scaling_report.summary({"reference switch": rows_})
    assert "ring 1.750-1.969x" in line
    assert "tree round trip 2.00-2.00x one switch's" in line


def test_prediction_adds_one_round_trip_per_level() -> None:
    costs = Costs(rtt_s=1e-3, alpha_s=1e-4)
    flat = predicted(Layout(8, "flat"), N, costs, 0.0, 0.0)
    tree = predicted(Layout(8, "tree", 2), N, costs, 0.0, 0.0)
    assert flat is not None and tree is not None
    # the same packets; each phase waits one round trip more, the parent's
    phases = len(phase_cells("fixed_point", N, 1.0, 8, verdict=False))  # no hook
    assert tree - flat == pytest.approx(phases * costs.rtt_s)
    assert predicted(Layout(8, "flat"), N, None, 0.0, 0.0) is None
    assert predicted(Layout(8, "gloo"), N, costs, 0.0, 0.0) is not None


def test_prediction_counts_a_leafs_workers_not_all_w() -> None:
    """On a switch bound by its packet rate the tree 2x4's busiest switch is a leaf: its 4
    workers' contributions and the parent's result a slot, against 8 on one switch."""
    costs = Costs(rtt_s=0.0)
    flat = predicted(Layout(8, "flat"), N, costs, 1e4, 0.0)
    tree = predicted(Layout(8, "tree", 2), N, costs, 1e4, 0.0)
    assert flat is not None and tree is not None
    assert tree / flat == pytest.approx(5 / 8)
    shared = predicted(Layout(8, "tree", 2), N, costs, 1e4, 0.5)  # half a core a process
    assert shared == pytest.approx(2 * tree)


def test_cli_refuses_a_layout_before_needing_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert tree_scaling.main(["--flat", "64"]) == 2
    assert "give a tree" in capsys.readouterr().err


def test_parser_defaults_are_the_issue_s_layouts() -> None:
    args: argparse.Namespace = tree_scaling._parser().parse_args([])
    got = plan(args.flat, args.tree, args.gloo)
    assert sum(lay.kind == "tree" for lay in got) == 5
    assert max(lay.workers for lay in got) == 64
