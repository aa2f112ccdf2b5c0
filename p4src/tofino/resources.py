"""The resource summary of a bf-p4c compile, as deterministic text (no dates, no run ids,
no paths), so that p4src/tofino/build/resources.txt changes only when the allocation does.

    python3 p4src/tofino/resources.py <bf-p4c output directory>

It reads the compiler's `logs/resources.json` (per MAU stage: SRAM, map RAM, TCAM,
stateful and statistics ALUs, gateways, hash distribution units, VLIW instructions,
logical tables, each beside its capacity; the PHV containers the chip has; the parsers'
TCAM rows and the deparsers' POV bits) and `logs/phv.json` (the PHV containers in use)
under the output directory. The field names are those of bf-p4c's schemas
(compiler_interfaces/schemas/resources_schema.py and phv_schema.py). Standard library only:
the Makefile runs it with the system Python."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# (column title, the stage's block in resources.json, its list of used units, the keys
# whose product is the block's units per stage)
STAGE_COLUMNS = (
    ("SRAM", "rams", "srams", ("nRows", "nColumns")),
    ("map RAM", "map_rams", "maprams", ("nRows", "nUnits")),
    ("TCAM", "tcams", "tcams", ("nRows", "nColumns")),
    ("stateful ALU", "meter_alus", "meters", ("nAlus",)),
    ("stats ALU", "statistic_alus", "stats", ("nAlus",)),
    ("gateway", "gateways", "gateways", ("nRows", "nUnits")),
    ("hash dist", "hash_distribution_units", "units", ("nHashIds", "nUnitIds")),
    ("VLIW instr", "vliw", "instructions", ("size",)),
    ("logical table", "logical_tables", "ids", ("size",)),
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


def _capacity(block: dict, keys: tuple[str, ...]) -> int:
    """Units of one resource in a stage: the product of the counts the schema gives."""
    units = 1
    for key in keys:
        if key not in block:
            return 0
        units *= int(block[key])
    return units


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
        for i, (_, key, list_key, cap_keys) in enumerate(STAGE_COLUMNS):
            block = stage.get(key) or {}
            used.append(len(block.get(list_key, [])))
            capacity[i] = max(capacity[i], _capacity(block, cap_keys))
        rows.append((int(stage["stage_number"]), used))
    return n_stages, rows, capacity


def phv_capacity(resources: dict) -> dict[tuple[str, int], int]:
    """Containers the chip has, per (kind: normal or tagalong, bit width); both threads
    share them."""
    have = (resources.get("resources") or {}).get("phv_containers") or {}
    return {
        (kind, int(t["width"])): int(t["units"])
        for kind in ("normal", "tagalong")
        for t in have.get(kind) or []
    }


def phv_usage(phv: dict) -> dict[tuple[str, int], dict[str, tuple[int, int]]]:
    """Per (kind, bit width), per thread: (containers holding a field, bits of fields)."""
    containers: Counter[tuple[str, int, str]] = Counter()
    bits: Counter[tuple[str, int, str]] = Counter()
    for c in phv.get("containers", []):
        if not c.get("slices"):
            continue
        key = (str(c.get("container_type", "normal")), int(c["bit_width"]), str(c["gress"]))
        containers[key] += 1
        for s in c["slices"]:
            info = s.get("slice_info", {})
            bits[key] += int(info.get("msb", 0)) - int(info.get("lsb", 0)) + 1
    usage: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}
    for kind, width, gress in sorted(containers):
        usage.setdefault((kind, width), {})[gress] = (
            containers[kind, width, gress],
            bits[kind, width, gress],
        )
    return usage


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return lines


def _phv_lines(resources: dict, phv: dict) -> list[str]:
    usage, capacity = phv_usage(phv), phv_capacity(resources)
    rows = []
    for kind, width in sorted(set(usage) | set(capacity)):
        per = usage.get((kind, width), {})
        ig, eg = per.get("ingress", (0, 0)), per.get("egress", (0, 0))
        have = capacity.get((kind, width))
        rows.append(
            (
                f"{kind} {width}-bit",
                ig[0],
                eg[0],
                have if have is not None else "-",
                ig[1] + eg[1],
                have * width if have is not None else "-",
            )
        )
    head = ["PHV containers", "ingress", "egress", "of", "field bits", "of bits"]
    unknown = any(r[3] == "-" for r in rows)
    note = ["", "-: the compiler's resources.json gives no total for this kind"] if unknown else []
    return _table(head, rows) + note


def _parde_lines(resources: dict) -> list[str]:
    res = resources.get("resources") or {}
    rows = []
    for p in (res.get("parser") or {}).get("parsers") or []:
        rows.append(
            (f"{p['gress']} parser {p['parser_id']}", "TCAM rows", len(p["states"]), p["nStates"])
        )
    for d in res.get("deparser") or []:
        pov = d.get("pov") or {}
        if "size" in pov:
            rows.append(
                (f"{d['gress']} deparser", "POV bits", len(pov.get("pov_bits", [])), pov["size"])
            )
    return _table(["unit", "resource", "used", "of"], sorted(rows)) if rows else []


def summarize(out: Path) -> list[str]:
    """The summary's lines for one compile."""
    resources = json.loads(find_log(out, "resources.json").read_text())
    phv = json.loads(find_log(out, "phv.json").read_text())
    n_stages, rows, capacity = stage_rows(resources)
    busy = [r for r in rows if any(r[1])]
    totals = [sum(r[1][i] for r in rows) for i in range(len(STAGE_COLUMNS))]
    parde = _parde_lines(resources)
    return [
        f"program: {resources.get('program_name', '?')}",
        f"compiler: bf-p4c {resources.get('compiler_version', '?')}",
        f"target: {phv.get('target', '?')}",
        f"MAU stages used: {len(busy)} of {n_stages}",
        "",
        *_table(
            ["stage", *(c[0] for c in STAGE_COLUMNS)],
            [
                *((s, *used) for s, used in busy),
                ("per stage", *capacity),
                (
                    "all (of the chip)",
                    *(f"{t} of {c * n_stages}" for t, c in zip(totals, capacity)),
                ),
            ],
        ),
        "",
        *_phv_lines(resources, phv),
        *(["", *parde] if parde else []),
    ]


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
