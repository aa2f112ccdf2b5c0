"""Lane arithmetic of the adding ops (docs/protocol.md, "Lanes"): an int32 cell holds
32/bits signed lanes, lane i in bits [bits*i, bits*(i+1)) of the cell's value, and the
switch adds each lane modulo 2^bits with no carry into its neighbour. The switch's
combine table (homagg/wire/combine.py) and the low-bit codec use these definitions."""

from __future__ import annotations

import numpy as np

from homagg.wire.constants import CELL_BITS


def top_bits(bits: int) -> np.uint32:
    """The top bit of every `bits`-bit lane of a cell (0x80008000 for 16-bit lanes)."""
    if bits not in (8, 16, 32):
        raise ValueError(f"lanes are 8, 16 or 32 bits wide, not {bits}")
    lane_top = 1 << (bits - 1)
    return np.uint32(sum(lane_top << (bits * i) for i in range(CELL_BITS // bits)))


def lanes_add(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """Per-lane wrapping add of two int32 cell arrays, as the P4 program's lanes_add_narrow:
    the low bits of each lane are added with the top bits cleared (no carry can leave the
    lane), then the top bits are the XOR of both and of that carry."""
    tops = top_bits(bits)
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    low = (ua & ~tops) + (ub & ~tops)
    return (low ^ ((ua ^ ub) & tops)).view(np.int32)


def split_lanes(cells: np.ndarray, bits: int) -> np.ndarray:
    """The signed lanes of int32 cells, lane 0 of cell 0 first (int32 result)."""
    if bits == 32:
        return cells.astype(np.int32)
    n = CELL_BITS // bits
    shifts = (bits * np.arange(n)).astype(np.uint32)
    u = (cells.view(np.uint32)[:, None] >> shifts) & np.uint32((1 << bits) - 1)
    signed = u.astype(np.int32)
    signed -= (signed >> (bits - 1)) << bits  # two's complement of each lane
    return signed.reshape(-1)


def join_lanes(lanes: np.ndarray, bits: int) -> np.ndarray:
    """int32 cells holding signed `lanes` (each in the lane's range), lane 0 first; a
    partial last cell is padded with zero lanes."""
    if bits == 32:
        return lanes.astype(np.int32)
    n = CELL_BITS // bits
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if lanes.size and (lanes.min() < lo or lanes.max() > hi):
        raise ValueError(f"a lane value lies outside the {bits}-bit range [{lo}, {hi}]")
    u = lanes.astype(np.int64) & ((1 << bits) - 1)
    u = np.concatenate([u, np.zeros(-u.size % n, np.int64)]).reshape(-1, n)
    shifts = bits * np.arange(n, dtype=np.int64)
    return (u << shifts).sum(axis=1).astype(np.uint32).view(np.int32)
