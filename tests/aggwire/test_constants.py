"""aggwire.constants mirrors p4src/include/constants.p4: one source, checked."""

from __future__ import annotations

import re
from pathlib import Path

from aggwire import constants as c

CONSTANTS_P4 = Path(__file__).resolve().parents[2] / "p4src" / "include" / "constants.p4"


def p4_values() -> dict[str, int]:
    """NAME -> value for every `const bit<N> NAME = V;` and numeric `#define NAME V`."""
    text = CONSTANTS_P4.read_text()
    values: dict[str, int] = {}
    for name, expr in re.findall(r"#define\s+(\w+)\s+(\d+)\s*$", text, re.M):
        values[name] = int(expr)
    for name, expr in re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*([^;]+);", text):
        values[name] = eval(expr, {"__builtins__": {}}, dict(values))  # arithmetic on constants
    return values


def test_wire_constants_match_the_p4_program():
    p4 = p4_values()
    assert p4["CELLS_PER_PKT"] == c.CELLS_PER_PKT
    assert p4["NUM_SLOTS"] == c.NUM_SLOTS
    assert p4["AGG_UDP_PORT"] == c.AGG_UDP_PORT
    assert p4["AGG_VERSION"] == c.AGG_VERSION
    assert p4["AGG_HEADER_BYTES"] == c.AGG_HEADER_BYTES
    assert p4["AGG_UDP_LENGTH"] == c.AGG_UDP_LENGTH
    assert p4["AGG_IPV4_LENGTH"] == c.AGG_IPV4_LENGTH
    assert p4["RESULT_TTL"] == c.RESULT_TTL
    assert p4["NUM_DROP_REASONS"] == c.NUM_DROP_REASONS
    assert p4["NUM_EVENTS"] == c.NUM_EVENTS
    for flag in c.Flag:
        assert p4[f"AGG_FLAG_{flag.name}"] == flag.value
    for op in c.Op:
        assert p4[f"AGG_OP_{op.name}"] == op.value
    for reason in c.DropReason:
        assert p4[f"DROP_{reason.name}"] == reason.value
    for event in c.Event:
        assert p4[f"EVENT_{event.name}"] == event.value
    assert len(c.DropReason) <= c.NUM_DROP_REASONS and len(c.Event) <= c.NUM_EVENTS


def test_every_p4_drop_reason_is_known_to_python():
    p4 = p4_values()
    names = {k[len("DROP_"):] for k in p4 if k.startswith("DROP_")}
    assert names == {r.name for r in c.DropReason}
