"""Where and how the benchmarks leave their results: bench/results/<name>.md (also
printed, with the one-line SUMMARY that `make bench` collects) and PNG plots."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (homagg/lab/plotting.py)."""
    from homagg.lab.plotting import pyplot

    return pyplot()


def heading(what: str, *extra: str) -> str:
    """A result's first line: what it measured, on which machine and day (and `extra`)."""
    facts = [platform.machine(), f"{os.cpu_count()} cores", time.strftime("%Y-%m-%d"), *extra]
    return f"# {what} ({', '.join(facts)})"


def plot_path(name: str) -> Path:
    """bench/results/<name>, the directory made if missing."""
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / name


def publish(
    name: str, lines: list[str], summary: str | None = None, failed: Sequence[str] = ()
) -> None:
    """Write bench/results/<name>.md, print it, then `SUMMARY <summary>` if given; the
    runs that `failed` (not in the tables) are listed at its end."""
    if failed:
        lines = [
            *lines,
            "",
            "Runs that failed (not in the tables):",
            "",
            *(f"- {f}" for f in failed),
        ]
    plot_path(f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if summary is not None:
        print("SUMMARY " + summary, flush=True)
