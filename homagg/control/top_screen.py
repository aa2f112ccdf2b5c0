"""`aggctl top`'s screen: a TopView as plain text lines that fit a terminal's width (a
narrow terminal loses the least needed columns first, then the ends of lines), and as the
JSON document of `--json`. Pure functions: no terminal, no controller."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from homagg.control.text_table import duration
from homagg.control.top_view import NO_SWITCH, JobRow, SwitchRow, TopView

MIN_WIDTH = 20  # narrower terminals are drawn as if this wide (and wrap)


def amount(value: float | None) -> str:
    """A count or rate in at most 5 characters: '-', 0, 7.5, 950, 12.3k, 4.1M, 2.0G."""
    if value is None:
        return "-"
    if value < 99.95 and value != int(value):
        return f"{value:.1f}"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            digits = 1 if value < 99.95 * scale else 0
            return f"{value / scale:.{digits}f}{unit}"
    return f"{value:.0f}"


@dataclasses.dataclass(frozen=True)
class Column:
    """A job table column: its header, its cell, and its rank when the width runs out (the
    highest `keep` stays longest)."""

    header: str
    cell: Callable[[JobRow], str]
    keep: int
    right: bool = False  # numbers align right


COLUMNS = (
    Column("JOB", lambda j: str(j.job_id), 10),
    Column("NAME", lambda j: j.name, 7),
    Column("STATE", lambda j: j.state, 8),
    Column("RANKS", lambda j: f"{j.joined}/{j.world_size}", 5),
    Column("CODEC", lambda j: j.codec, 3),
    Column("POOL", lambda j: str(j.pool_size), 1, True),
    Column("PKT/S", lambda j: amount(j.packets_per_s), 9, True),
    Column(
        "MB/S", lambda j: amount(None if j.bytes_per_s is None else j.bytes_per_s / 1e6), 6, True
    ),
    Column("PACKETS", lambda j: amount(j.packets), 2, True),
    Column("GAVE UP", lambda j: str(j.gave_ups), 4, True),
)


def _table(columns: Sequence[Column], jobs: Sequence[JobRow]) -> list[str]:
    cells = [[c.header for c in columns]] + [[c.cell(j) for c in columns] for j in jobs]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return [
        "  "
        + "  ".join(
            v.rjust(w) if c.right else v.ljust(w) for v, w, c in zip(r, widths, columns)
        ).rstrip()
        for r in cells
    ]


def job_table(jobs: Sequence[JobRow], width: int) -> list[str]:
    """The jobs' rows under a header, indented, without the columns that do not fit."""
    columns = list(COLUMNS)
    lines = _table(columns, jobs)
    while max(map(len, lines)) > width and len(columns) > 2:
        columns.remove(min(columns, key=lambda c: c.keep))
        lines = _table(columns, jobs)
    return lines


def _switch_lines(sw: SwitchRow) -> list[str]:
    """The switch's name and state, then its rates and the reasons of its drops, busiest
    first (since the last refresh)."""
    if sw.name == NO_SWITCH:
        return ["no switch yet (placed when a worker joins)"]
    head = f"switch {sw.name}"
    if sw.connected is not None:
        head += f"  {sw.role if sw.connected else 'NOT CONNECTED'}"
    if sw.slots_used is not None:
        head += f"  slots {sw.slots_used}/{sw.slots_total}"
    if sw.error:
        return [head, f"  counters unreadable: {sw.error}"]
    rates = [
        ("contrib/s", sw.contributions_per_s),
        ("results/s", sw.results_per_s),
        ("resent/s", sw.resent_per_s),
        ("drops/s", sw.drops_per_s),
    ]
    if all(v is None for _, v in rates):
        return [head]
    line = "  " + "  ".join(f"{amount(v)} {what}" for what, v in rates)
    reasons = sorted(sw.drops_per_s_by_reason.items(), key=lambda kv: -kv[1])
    if reasons:
        line += ": " + ", ".join(f"{r} {amount(v)}" for r, v in reasons)
    return [head, line]


def _header(view: TopView) -> str:
    jobs = sum(len(s.jobs) for s in view.switches)
    parts = [f"aggctl top  {view.controller}"]
    if view.uptime_s is not None:
        parts.append(f"up {duration(view.uptime_s)}")
    parts.append(f"{jobs} job{'s' if jobs != 1 else ''}")
    if view.interval_s is not None:
        parts.append(f"rates over {view.interval_s:.1f}s")
    parts.append(time.strftime("%H:%M:%S", time.localtime(view.time)))
    return "  ".join(parts)


def _fit(line: str, width: int) -> str:
    """The line cut to `width` characters, the cut marked with '>'."""
    return line if len(line) <= width else line[: width - 1] + ">"


def render(view: TopView, width: int = 80, height: int | None = None) -> str:
    """The screen: a header, then per switch its line, its jobs and its drop reasons, then
    the notes; every line at most `width` long, at most `height` lines (the last one then
    says how many were left out)."""
    width = max(width, MIN_WIDTH)
    lines = [_header(view), ""]
    for sw in view.switches:
        lines += _switch_lines(sw)
        lines += job_table(sw.jobs, width) if sw.jobs else ["  no jobs"]
        lines.append("")
    if not view.switches:
        lines += ["no switches or jobs visible to this credential", ""]
    lines += view.notes
    lines = [_fit(line, width) for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    if height is not None and len(lines) > max(height, 2):
        left = len(lines) - (max(height, 2) - 1)
        lines = [*lines[: max(height, 2) - 1], _fit(f"... {left} more lines", width)]
    return "\n".join(lines)


def to_json(view: TopView) -> dict[str, Any]:
    """`--json`'s document of one refresh (every field, null where unknown)."""
    return dataclasses.asdict(view)
