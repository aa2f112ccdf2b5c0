"""The pure half of bench/tree_scaling.py: the layouts it measures (one switch, a two-level
tree, gloo's ring), the rows it reports (bytes per worker and step time side by side,
with the projection model's prediction where a calibration exists), the markdown and the
plot. No root, no processes: tests/bench feed it made-up measurements."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.projection_check import this_machine
from bench.projection_model import (
    BYTES_PER_ELEMENT,
    Costs,
    frame_bytes,
    ring_step,
    switch_step,
)
from homagg.wire.constants import CELLS_PER_PKT, MAX_WORKERS_PER_JOB

KINDS = ("flat", "tree", "gloo")


@dataclass(frozen=True, order=True)
class Layout:
    """Where W workers aggregate: `flat` (one switch, leaves = 1), `tree` (leaves x
    per_leaf workers under one parent switch) or `gloo` (gloo's ring, W processes)."""

    workers: int
    kind: str
    leaves: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"layout kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.workers < 1 or self.leaves < 1 or self.workers % self.leaves:
            raise ValueError(f"{self.workers} workers do not split over {self.leaves} leaves")
        if self.kind != "tree" and self.leaves != 1:
            raise ValueError(f"a {self.kind} layout has no leaves: leaves = 1, not {self.leaves}")
        if self.kind == "flat" and self.workers > MAX_WORKERS_PER_JOB:
            raise ValueError(
                f"{self.workers} workers on one switch: at most {MAX_WORKERS_PER_JOB} "
                "(the seen bitmap); give a tree, e.g. --tree 4x16"
            )
        if self.kind == "tree" and (
            self.leaves < 2 or self.per_leaf > MAX_WORKERS_PER_JOB or self.leaves > 32
        ):
            raise ValueError(
                f"tree {self.leaves}x{self.per_leaf}: 2..32 leaves of at most "
                f"{MAX_WORKERS_PER_JOB} workers each"
            )

    @property
    def per_leaf(self) -> int:
        return self.workers // self.leaves

    @property
    def levels(self) -> int:
        """Switch levels a contribution crosses (0 for gloo)."""
        return {"flat": 1, "tree": 2, "gloo": 0}[self.kind]

    @property
    def label(self) -> str:
        if self.kind == "tree":
            return f"tree {self.leaves}x{self.per_leaf}"
        return f"{self.kind} {self.workers}"


def parse_tree(text: str) -> Layout:
    """'2x16' -> a tree of 2 leaves with 16 workers each (argparse type)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"tree {text!r}: LEAVESxWORKERS, e.g. 2x16")
    leaves, per_leaf = int(parts[0]), int(parts[1])
    return Layout(leaves * per_leaf, "tree", leaves)


def plan(flat: list[int], trees: list[Layout], gloo: list[int]) -> list[Layout]:
    """Every layout once, by W, one switch before the tree before gloo: the order each
    repetition runs them in (so the rows of one W are measured next to each other)."""
    layouts = {Layout(w, "flat") for w in flat} | set(trees) | {Layout(w, "gloo") for w in gloo}
    return sorted(layouts, key=lambda lay: (lay.workers, KINDS.index(lay.kind), lay.leaves))


def _median(rec: dict[str, Any], key: str) -> float:
    return statistics.median(rec[key])


def predicted(
    lay: Layout, n: int, costs: Costs | None, switch_pps: float, cores: float
) -> float | None:
    """The projection model's step seconds for this machine, W worker threads on `cores`
    cores, a tree's leaves holding its per_leaf workers each (None: no calibration)."""
    if costs is None:
        return None
    per_leaf = lay.per_leaf if lay.kind == "tree" else MAX_WORKERS_PER_JOB
    cluster = this_machine(lay.workers, n, switch_pps, cores, lay.levels, per_leaf)
    if lay.kind == "gloo":
        return ring_step(cluster, costs).seconds
    return switch_step(cluster, costs, "fixed_point", verdict=False).seconds


def _find(measured: dict[Layout, dict[str, Any]], w: int, kind: str) -> dict[str, Any] | None:
    """The measurement of W workers in a layout of `kind` with one leaf, if any."""
    return next((r for lay, r in measured.items() if (lay.workers, lay.kind) == (w, kind)), None)


def rows(measured: dict[Layout, dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Per layout: bytes per worker x the dense gradient (switch: packets sent x frame;
    ring: 2(W-1)/W), median step and round trip, and ratios to the same W's flat and gloo."""
    dense = BYTES_PER_ELEMENT * n
    out = []
    for lay in sorted(measured, key=lambda x: (x.workers, KINDS.index(x.kind), x.leaves)):
        rec = measured[lay]
        secs = _median(rec, "secs")
        if lay.kind == "gloo":
            ratio = 2 * (lay.workers - 1) / lay.workers
        else:
            ratio = _median(rec, "packets") / lay.workers * frame_bytes(CELLS_PER_PKT) / dense
        gloo, flat = (_find(measured, lay.workers, kind) for kind in ("gloo", "flat"))
        out.append(
            {
                "layout": lay,
                "bytes_ratio": ratio,
                "secs": secs,
                "secs_range": (min(rec["secs"]), max(rec["secs"])),
                "vs_gloo": secs / _median(gloo, "secs") if gloo else None,
                "vs_flat": secs / _median(flat, "secs") if flat and lay.kind != "gloo" else None,
                "rtt": _median(rec, "rtt") if rec.get("rtt") else None,
                "rtt_vs_flat": (
                    _median(rec, "rtt") / _median(flat, "rtt")
                    if rec.get("rtt") and flat and flat.get("rtt")
                    else None
                ),
                "retx": rec.get("retx", 0),
                "predicted": rec.get("predicted"),
            }
        )
    return out


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(target: str, rows_: list[dict[str, Any]], n: int) -> list[str]:
    """One target's markdown table."""
    lines = [
        f"### {target}, n = {n:,} float32 ({BYTES_PER_ELEMENT * n / 1e6:.2f} MB) per worker",
        "",
        "| W | layout | bytes / worker (x gradient) | step ms, median [min, max] | "
        "predicted ms | vs flat | vs gloo | round trip us | vs flat | retx |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows_:
        lay, (lo, hi) = r["layout"], r["secs_range"]
        lines.append(
            f"| {lay.workers} | {lay.label} | {r['bytes_ratio']:.3f} | "
            f"{r['secs'] * 1e3:.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}] | "
            f"{_opt(None if r['predicted'] is None else r['predicted'] * 1e3, '.1f')} | "
            f"{_opt(r['vs_flat'], '.2f')} | {_opt(r['vs_gloo'], '.2f')} | "
            f"{_opt(None if r['rtt'] is None else r['rtt'] * 1e6, '.0f')} | "
            f"{_opt(r['rtt_vs_flat'], '.2f')} | {r['retx'] if lay.kind != 'gloo' else '-'} |"
        )
    return [*lines, ""]


def summary(per_target: dict[str, list[dict[str, Any]]]) -> str:
    """One line: the switch's bytes per worker over W against the ring's, and the tree's
    round trip over one switch's, per target."""
    parts = []
    for target, rows_ in per_target.items():
        sw = [r["bytes_ratio"] for r in rows_ if r["layout"].kind != "gloo"]
        ring = [r["bytes_ratio"] for r in rows_ if r["layout"].kind == "gloo"]
        rtts = [r["rtt_vs_flat"] for r in rows_ if r["rtt_vs_flat"] and r["layout"].kind == "tree"]
        part = f"{target}: switch bytes/worker {min(sw, default=0):.3f}-{max(sw, default=0):.3f}x"
        if ring:
            part += f", ring {min(ring):.3f}-{max(ring):.3f}x"
        if rtts:
            part += f", tree round trip {min(rtts):.2f}-{max(rtts):.2f}x one switch's"
        parts.append(part)
    return "tree scaling: " + "; ".join(parts)


def plot(per_target: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Bytes per worker and step time against W, a row of two panels per target."""
    from bench.publish import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(len(per_target), 2, figsize=(10, 3.6 * len(per_target)), squeeze=False)
    styles = {"flat": "bo-", "tree": "gs-", "gloo": "k^--"}
    for i, (target, rows_) in enumerate(per_target.items()):
        for kind, style in styles.items():
            got = [r for r in rows_ if r["layout"].kind == kind]
            if not got:
                continue
            ws = [r["layout"].workers for r in got]
            label = {"flat": "one switch", "tree": "two-level tree", "gloo": "gloo ring"}[kind]
            axes[i][0].plot(ws, [r["bytes_ratio"] for r in got], style, label=label)
            axes[i][1].plot(ws, [r["secs"] * 1e3 for r in got], style, label=label)
        for ax, ylabel in zip(axes[i], ("bytes per worker (x gradient)", "step ms"), strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("workers W")
            ax.set_ylabel(ylabel)
            ax.set_title(target)
            ax.grid(True, which="both", alpha=0.3)
        axes[i][1].set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
