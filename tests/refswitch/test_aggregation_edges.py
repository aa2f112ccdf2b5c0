"""Edges of the Aggregation control's arithmetic in the reference switch: the pool check
near 2^32 (pool_base + slot must never wrap into another job's slots) and the verdict
codes shared with p4src/include/constants.p4."""

from __future__ import annotations

import itertools

import pytest
from p4source import constant_values

from homagg.refswitch import aggregation
from homagg.refswitch.aggregation import slot_in_pool
from homagg.wire.constants import NUM_SLOTS

U32 = 2**32 - 1
POOL_BASES = [
    0,
    1,
    NUM_SLOTS - 5,
    NUM_SLOTS - 4,
    NUM_SLOTS - 1,
    NUM_SLOTS,
    NUM_SLOTS + 1,
    2**16,
    2**31 - 1,
    2**31,
    U32 - NUM_SLOTS,
    U32 - 4,
    U32 - 3,
    U32 - 2,
    U32 - 1,
    U32,
]
POOL_SIZES = [0, 1, 4, NUM_SLOTS - 1, NUM_SLOTS, 2**16 - 1]
SLOTS = [0, 1, 2, 3, 4, NUM_SLOTS - 1, NUM_SLOTS, 2**16 - 1]


def bmv2_in_pool(pool_base: int, pool_size: int, slot: int) -> bool:
    """The P4 condition as bit<32> arithmetic, every operand evaluated (BMv2 need not
    short-circuit `||`): NUM_SLOTS - pool_base wraps, but only when the first term holds."""
    out = (pool_base >= NUM_SLOTS) | (slot >= pool_size) | (slot >= ((NUM_SLOTS - pool_base) & U32))
    return not out


def old_in_pool(pool_base: int, pool_size: int, slot: int) -> bool:
    """The check before issue 11: pool_base + slot computed in 32 bits."""
    return slot < pool_size and (pool_base + slot) & U32 < NUM_SLOTS


@pytest.mark.parametrize(
    "pool_base, pool_size, slot, inside",
    [
        (0, 4, 0, True),
        (0, 4, 3, True),
        (0, 4, 4, False),
        (0, 0, 0, False),
        (NUM_SLOTS - 4, 4, 3, True),
        (NUM_SLOTS - 3, 4, 3, False),
        (NUM_SLOTS - 1, 1, 0, True),
        (NUM_SLOTS, 4, 0, False),
        (0, 2**16 - 1, NUM_SLOTS - 1, True),
        (0, 2**16 - 1, NUM_SLOTS, False),
        (U32, 4, 1, False),
        (U32 - 1, 4, 2, False),
        (U32 - 1, 4, 3, False),
        (U32 - 1, 2**16 - 1, 102, False),  # wrapped, this was slot 100 of the switch
    ],
)
def test_pool_check_at_the_edges(pool_base, pool_size, slot, inside):
    assert slot_in_pool(pool_base, pool_size, slot) is inside
    assert bmv2_in_pool(pool_base, pool_size, slot) is inside


def test_pool_check_is_unbounded_arithmetic_on_every_edge_combination():
    for base, size, slot in itertools.product(POOL_BASES, POOL_SIZES, SLOTS):
        exact = slot < size and base + slot < NUM_SLOTS
        assert slot_in_pool(base, size, slot) is exact, (base, size, slot)
        assert bmv2_in_pool(base, size, slot) is exact, (base, size, slot)


def test_the_old_32_bit_check_let_wrapped_slots_in():
    """What the new check fixes: a pool at 2^32 - 2 reached slots 0 and 1 of the switch."""
    assert old_in_pool(U32 - 1, 4, 2) and old_in_pool(U32 - 1, 4, 3)
    assert not slot_in_pool(U32 - 1, 4, 2) and not slot_in_pool(U32 - 1, 4, 3)


def test_verdict_codes_are_the_p4_programs():
    p4 = constant_values()
    names = [n for n in vars(aggregation) if n.startswith("VERDICT_")]
    assert names and {n: getattr(aggregation, n) for n in names} == {
        n: v for n, v in p4.items() if n.startswith("VERDICT_")
    }
