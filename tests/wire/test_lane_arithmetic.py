"""homagg.wire.lanes: the lane layout and the per-lane wrapping add (against a Python-int
oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.lanes import join_lanes, lanes_add, split_lanes, top_bits


def oracle_add(a: int, b: int, bits: int) -> int:
    mask = (1 << bits) - 1
    out = 0
    for lane in range(32 // bits):
        s = (((a >> (bits * lane)) & mask) + ((b >> (bits * lane)) & mask)) & mask
        out |= s << (bits * lane)
    return out - (1 << 32) if out >= 1 << 31 else out


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_lanes_add_matches_the_oracle(bits):
    rng = np.random.default_rng(bits)
    edges = [0, 1, -1, 2**31 - 1, -(2**31), 0x7F7F7F7F, -0x7F7F7F80, 0x00FF00FF, 0x7FFF7FFF]
    a = np.array(edges + list(rng.integers(-(2**31), 2**31, 500)), np.int64).astype(np.int32)
    b = np.array(edges[::-1] + list(rng.integers(-(2**31), 2**31, 500)), np.int64).astype(np.int32)
    got = lanes_add(a, b, bits)
    want = [oracle_add(int(x), int(y), bits) for x, y in zip(a, b)]
    np.testing.assert_array_equal(got, np.array(want, np.int32))


def test_top_bits_and_bad_width():
    assert top_bits(16) == 0x80008000 and top_bits(8) == 0x80808080 and top_bits(32) == 1 << 31
    with pytest.raises(ValueError, match="8, 16 or 32"):
        top_bits(4)


@pytest.mark.parametrize("bits", [8, 16])
def test_join_split_round_trip_and_layout(bits):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    lanes = np.array([lo, hi, -1, 0, 1, 5, lo + 1], np.int32)
    cells = join_lanes(lanes, bits)
    assert cells.size == -(-lanes.size // (32 // bits))
    np.testing.assert_array_equal(split_lanes(cells, bits)[: lanes.size], lanes)
    assert not split_lanes(cells, bits)[lanes.size :].any()  # padding lanes are zero
    # lane 0 sits in the cell's lowest bits
    assert join_lanes(np.array([1] + [0] * (32 // bits - 1)), bits)[0] == 1
    with pytest.raises(ValueError, match="outside"):
        join_lanes(np.array([hi + 1]), bits)
