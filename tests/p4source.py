"""Reading p4src/ as text, for the tests that keep the Python side and the P4 program in
step without p4c: constants, typedefs, header declarations and named slices.

Importable by every suite: pytest puts tests/ on sys.path when it imports tests/conftest.py.
"""

from __future__ import annotations

import re
from pathlib import Path

P4SRC = Path(__file__).resolve().parents[1] / "p4src"
CONSTANTS_P4 = P4SRC / "include" / "constants.p4"
HEADERS_P4 = P4SRC / "include" / "headers.p4"
AGGREGATION_P4 = P4SRC / "aggregation.p4"

_ARITHMETIC = re.compile(r"^(?:[\w\s()*+/-]|<<)+$")


def source(path: Path) -> str:
    """The file's text without its comments (/* */ and //)."""
    text = re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _evaluate(expr: str, known: dict[str, int]) -> int | None:
    """An integer expression over literals and known names, or None when it is not one."""
    if not _ARITHMETIC.match(expr) or not set(re.findall(r"\b[A-Za-z_]\w*", expr)) <= set(known):
        return None
    value = eval(expr.replace("/", "//"), {"__builtins__": {}}, dict(known))  # checked above
    return value if isinstance(value, int) else None


def constant_values() -> dict[str, int]:
    """NAME -> value for every `const bit<N> NAME = V;` and every `#define NAME expr` of
    constants.p4 whose expression is integer arithmetic (NUM_SLOT_COPIES, CELL_GROUPS)."""
    text = source(CONSTANTS_P4)
    values: dict[str, int] = {}
    for name, expr in re.findall(r"^#define[ \t]+(\w+)[ \t]+([^\n]+?)[ \t]*$", text, re.M):
        value = _evaluate(expr, values)
        if value is not None:
            values[name] = value
    for name, expr in re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*([^;]+);", text):
        value = _evaluate(expr.strip(), values)
        if value is None:
            raise ValueError(f"cannot evaluate the P4 constant {name} = {expr}")
        values[name] = value
    return values


def typedef_widths() -> dict[str, int]:
    """typedef name -> width in bits, for every `typedef bit<N> name;` of include/."""
    text = source(CONSTANTS_P4) + source(HEADERS_P4)
    return {name: int(bits) for bits, name in re.findall(r"typedef\s+bit<(\d+)>\s+(\w+)\s*;", text)}


def header_fields(header: str) -> list[tuple[str, int]]:
    """(field name, width in bits) of `header <header> { ... }` in headers.p4, in
    declaration order, with typedefs resolved."""
    match = re.search(rf"\bheader\s+{header}\s*\{{(.*?)\}}", source(HEADERS_P4), re.S)
    if match is None:
        raise ValueError(f"no header {header} in {HEADERS_P4.name}")
    widths = typedef_widths()
    fields = []
    for decl in filter(None, (d.strip() for d in match.group(1).split(";"))):
        kind, name = decl.split()
        bits = re.fullmatch(r"bit<(\d+)>", kind)
        fields.append((name, int(bits.group(1)) if bits else widths[kind]))
    return fields


def named_slices(prefix: str) -> dict[str, tuple[int, int]]:
    """NAME -> (hi, lo) for every `#define <prefix>NAME hi:lo` of constants.p4, in order."""
    text = source(CONSTANTS_P4)
    return {
        name: (int(hi), int(lo))
        for name, hi, lo in re.findall(
            rf"^#define[ \t]+{prefix}(\w+)[ \t]+(\d+):(\d+)[ \t]*$", text, re.M
        )
    }
