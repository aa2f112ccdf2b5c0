"""homagg.wire.combine: the switch's combine table has every op, and each entry is the op's
arithmetic (against Python-int oracles)."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.combine import COMBINE_OF_OP, combine_cells
from homagg.wire.constants import LANE_BITS_OF_OP, Op
from tests.wire.test_lane_arithmetic import oracle_add


def signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


ORACLES = {
    Op.OR: lambda a, b: signed32(a | b),
    Op.MAX: max,
    **{
        op: (lambda a, b, bits=bits: oracle_add(a, b, bits)) for op, bits in LANE_BITS_OF_OP.items()
    },
}


def test_every_op_has_one_entry():
    assert set(COMBINE_OF_OP) == set(Op) == set(ORACLES)


@pytest.mark.parametrize("op", list(Op))
def test_each_op_matches_its_oracle_and_leaves_its_inputs(op):
    rng = np.random.default_rng(int(op))
    edges = [0, 1, -1, 2**31 - 1, -(2**31), 0x7F7F7F7F, 0x00FF00FF, 0x7FFF7FFF]
    a = np.array(edges + list(rng.integers(-(2**31), 2**31, 300)), np.int64).astype(np.int32)
    b = np.array(edges[::-1] + list(rng.integers(-(2**31), 2**31, 300)), np.int64).astype(np.int32)
    a0, b0 = a.copy(), b.copy()
    got = combine_cells(op, a, b)
    want = [ORACLES[op](int(x), int(y)) for x, y in zip(a, b)]
    np.testing.assert_array_equal(got, np.array(want, np.int32))
    np.testing.assert_array_equal(a, a0)  # a new array: the caller stores it
    np.testing.assert_array_equal(b, b0)


def test_an_op_the_switch_does_not_have_is_refused():
    with pytest.raises(ValueError):
        combine_cells(9, np.zeros(1, np.int32), np.zeros(1, np.int32))
