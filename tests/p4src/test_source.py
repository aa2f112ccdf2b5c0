"""The P4 source keeps its own layouts consistent (no p4c needed): slot_state's named
slices tile the register entry, have the widths of the values stored in them, and
update_slot writes the fields back in the order it reads them."""

from __future__ import annotations

import re

from p4source import (
    AGGREGATION_P4,
    constant_values,
    header_fields,
    named_slices,
    source,
    typedef_widths,
)

from homagg.wire.constants import MAX_WORKERS_PER_JOB

SLOT_STATE_ORDER = ["JOB", "CHUNK", "SEEN", "COUNT", "EXP"]  # highest bits first


def action_body(name: str) -> str:
    text = source(AGGREGATION_P4)
    match = re.search(rf"action\s+{name}\s*\(\s*\)\s*\{{(.*?)\n    \}}", text, re.S)
    assert match, f"no {name} action in aggregation.p4"
    return match.group(1)


def update_slot_body() -> str:
    return action_body("update_slot")


def test_slot_state_slices_tile_the_entry_highest_first():
    slices = named_slices("SLOT_STATE_")
    assert list(slices) == SLOT_STATE_ORDER
    top = constant_values()["SLOT_STATE_BITS"]
    for name in SLOT_STATE_ORDER:
        hi, lo = slices[name]
        assert hi == top - 1 and lo <= hi, f"SLOT_STATE_{name} = {hi}:{lo} leaves a gap"
        top = lo
    assert top == 0


def test_slot_state_fields_have_the_widths_of_their_values():
    width = {name: hi - lo + 1 for name, (hi, lo) in named_slices("SLOT_STATE_").items()}
    typedefs, agg = typedef_widths(), dict(header_fields("agg_h"))
    assert width["JOB"] == typedefs["job_id_t"] == agg["job_id"]
    assert width["CHUNK"] == typedefs["chunk_t"] == agg["chunk"]
    assert width["SEEN"] == MAX_WORKERS_PER_JOB
    assert width["EXP"] == agg["exp"]
    assert width["COUNT"] == 8  # meta.count, compared with num_workers (bit<8>)


def test_update_slot_reads_by_name_and_writes_back_in_the_same_order():
    body = update_slot_body()
    reads = re.findall(r"\bst\[([^\]]*)\]", body)
    assert sorted(reads) == sorted(f"SLOT_STATE_{n}" for n in SLOT_STATE_ORDER), (
        f"slot_state read through bare bit positions: {reads}"
    )
    write = re.search(r"slot_state\.write\(\s*meta\.slot_index\s*,([^;]*)\);", body)
    assert write, "update_slot does not write slot_state"
    parts = [p.strip() for p in write.group(1).split("++")]
    assert parts == [f"new_{n.lower()}" for n in SLOT_STATE_ORDER]


def test_slot_copies_and_chunk_order_are_computed_by_name():
    """The slot copy index shifts by SHADOW_BITS and the older test reads the top bit of a
    chunk_t difference, both named in constants.p4 (no bare bit positions)."""
    assert named_slices("CHUNK_") == {"OLDER_BIT": (31, 31)}
    assert typedef_widths()["chunk_t"] - 1 == 31
    assert not re.findall(r"\[\d+:\d+\]", update_slot_body()), "a bare slice in update_slot"
    text = source(AGGREGATION_P4)
    assert "<< SHADOW_BITS" in text and not re.search(r"<<\s*\d", text)
    values = constant_values()
    assert values["SHADOW_COPIES"] == 1 << values["SHADOW_BITS"]


def test_accept_result_changes_only_the_count_and_exponent_of_the_state():
    """A parent's result marks the copy final (count's top bit) and keeps its exponent;
    job, chunk and seen bitmap are written back as read, in SLOT_STATE_* order."""
    body = action_body("accept_result")
    reads = dict(re.findall(r"\b(\w+)\s*=\s*st\[SLOT_STATE_(\w+)\]", body))
    assert sorted(reads.values()) == sorted(SLOT_STATE_ORDER)
    write = re.search(r"slot_state\.write\(\s*meta\.slot_index\s*,([^;]*)\);", body)
    assert write, "accept_result does not write slot_state"
    parts = [p.strip() for p in write.group(1).split("++")]
    by_field = {field: var for var, field in reads.items()}
    assert parts[:3] == [by_field[n] for n in ("JOB", "CHUNK", "SEEN")]
    assert parts[3:] == ["new_count", "new_exp"]
    assert "SLOT_FINAL" in body and not re.findall(r"\[\d+:\d+\]", body)
