"""The resource summary of a bf-p4c compile, as deterministic text (no dates, no run ids,
no paths), so that p4src/tofino/build/resources.txt changes only when the allocation does.

    python3 p4src/tofino/resources.py <bf-p4c output directory>

It reads the compiler's `logs/resources.json` (per MAU stage: SRAM, map RAM, TCAM,
stateful and statistics ALUs, gateways, logical tables) and `logs/phv.json` (the PHV
containers in use) under the output directory. Standard library only: the Makefile runs
it with the system Python."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# (column title, resources.json key of the stage, list key, per-stage capacity)
STAGE_COLUMNS = (
    ("SRAM", "rams", "srams"),
    ("map RAM", "map_rams", "maprams"),
    ("TCAM", "tcams", "tcams"),
    ("stateful ALU", "meter_alus", "meters"),
    ("stats ALU", "statistic_alus", "stats"),
    ("gateway", "gateways", "gateways"),
    ("logical table", "logical_tables", "ids"),
)


class SummaryError(Exception):
    """The output directory lacks a file the summary needs, or it is not what bf-p4c
    writes."""


def find_log(out: Path, name: str) -> Path:
    """The one `logs/<name>` under a bf-p4c output directory (one pipe: `pipe/logs`)."""
    found = sorted(out.glob(f"**/logs/{name}"))
    if len(found) != 1:
        raise SummaryError(
            f"expected one logs/{name} under {out}, found {len(found)}: "
            "was the program compiled with bf-p4c -g (it writes the logs)?"
        )
    return found[0]


def _capacity(block: dict, list_key: str) -> int:
    """Units of one resource in a stage, from the counts the compiler records beside it."""
    if "nRows" in block and "nColumns" in block:
        return int(block["nRows"]) * int(block["nColumns"])
    for key in ("nAlus", "size", "nGateways", "nUnits"):
        if key in block:
            return int(block[key])
    return len(block.get(list_key, []))


def stage_rows(resources: dict) -> tuple[int, list[tuple[int, list[int]]], list[int]]:
    """(stages on the chip, [(stage, used per column)], capacity per column per stage)."""
    try:
        mau = resources["resources"]["mau"]
        n_stages = int(mau["nStages"])
        stages = mau["mau_stages"]
    except (KeyError, TypeError) as e:
        raise SummaryError(f"resources.json has no MAU section ({e})") from e
    rows, capacity = [], [0] * len(STAGE_COLUMNS)
    for stage in sorted(stages, key=lambda s: int(s["stage_number"])):
        used = []
        for i, (_, key, list_key) in enumerate(STAGE_COLUMNS):
            block = stage.get(key) or {}
            used.append(len(block.get(list_key, [])))
            capacity[i] = max(capacity[i], _capacity(block, list_key))
        rows.append((int(stage["stage_number"]), used))
    return n_stages, rows, capacity


def phv_usage(phv: dict) -> dict[int, tuple[int, int]]:
    """Per container width: (containers holding a field, bits of fields they hold)."""
    containers: Counter[int] = Counter()
    bits: Counter[int] = Counter()
    for c in phv.get("containers", []):
        if not c.get("slices"):
            continue
        width = int(c["bit_width"])
        containers[width] += 1
        for s in c["slices"]:
            info = s.get("slice_info", {})
            bits[width] += int(info.get("msb", 0)) - int(info.get("lsb", 0)) + 1
    return {w: (containers[w], bits[w]) for w in sorted(containers)}


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return lines


def summarize(out: Path) -> list[str]:
    """The summary's lines for one compile."""
    resources = json.loads(find_log(out, "resources.json").read_text())
    phv = json.loads(find_log(out, "phv.json").read_text())
    n_stages, rows, capacity = stage_rows(resources)
    busy = [r for r in rows if any(r[1])]
    totals = [sum(r[1][i] for r in rows) for i in range(len(STAGE_COLUMNS))]
    lines = [
        f"program: {resources.get('program_name', '?')}",
        f"compiler: bf-p4c {resources.get('compiler_version', '?')}",
        f"MAU stages used: {len(busy)} of {n_stages}",
        "",
        *_table(
            ["stage", *(c[0] for c in STAGE_COLUMNS)],
            [
                *((s, *used) for s, used in busy),
                (
                    "all (of the chip)",
                    *(f"{t} of {c * n_stages}" for t, c in zip(totals, capacity)),
                ),
            ],
        ),
        "",
        *_table(
            ["PHV container width", "containers used", "field bits"],
            [(f"{w}-bit", n, b) for w, (n, b) in phv_usage(phv).items()],
        ),
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the summary of the output directory given as the one argument."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print("\n".join(summarize(Path(args[0]))))
    except SummaryError as e:
        print(f"resources.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
