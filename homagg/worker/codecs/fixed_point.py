"""The dense fixed-point codec (SwitchML): a MAX phase of block exponents, then one ADD
phase of every element's quantized value (homagg/worker/codecs/exponent.py: the shared rule), with
several offset-binary lanes per int32 cell when bits < 32 (lossy)."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from homagg.wire.constants import CELL_BITS, Op

from .base import CorruptResultError, GradInput, Phase, output_shape, to_dense
from .exponent import (
    DEFAULT_BLOCK,
    check_agreed,
    dense_exponents,
    dequantize_dense,
    headroom_bits,
    quantize_dense,
    raise_on_status,
    status_cell,
)

LANE_BITS = (2, 4, 8, 16, 32)


def pack_lanes(q: np.ndarray, bits: int, p: int) -> np.ndarray:
    """Pack 32/bits offset-binary lanes per int32 cell; W lane sums stay below 2^bits, so
    the switch's per-cell wrapping ADD never carries between lanes."""
    if bits == CELL_BITS:
        return q
    lanes = CELL_BITS // bits
    u = (q.astype(np.int64) + (1 << p)).astype(np.uint32)
    u = np.concatenate([u, np.full(-u.size % lanes, 1 << p, dtype=np.uint32)])
    shifts = bits * np.arange(lanes, dtype=np.uint32)
    cells = np.bitwise_or.reduce(u.reshape(-1, lanes) << shifts, axis=1)
    return cells.astype(np.uint32).view(np.int32)


def unpack_lanes(cells: np.ndarray, length: int, bits: int, p: int, world_size: int) -> np.ndarray:
    """Lane sums of combined cells back to per-element int64 sums of q."""
    if bits == CELL_BITS:
        return cells
    lanes = CELL_BITS // bits
    shifts = bits * np.arange(lanes, dtype=np.uint32)
    u = (cells.view(np.uint32)[:, None] >> shifts) & np.uint32((1 << bits) - 1)
    return u.reshape(-1)[:length].astype(np.int64) - world_size * (1 << p)


class FixedPoint:
    """Dense fixed-point codec (SwitchML): MAX phase of block exponents, then one ADD phase
    of every element's quantized value plus a status cell (bits < 32 packs several lanes
    per cell: lossy)."""

    def __init__(self, world_size: int, *, bits: int = 32, block: int | None = DEFAULT_BLOCK):
        if bits not in LANE_BITS:
            raise ValueError(f"bits must be one of {LANE_BITS}, not {bits}")
        self.world_size = world_size
        self.bits = bits
        self.block = block
        self.p = headroom_bits(world_size, bits)

    def _block_of(self, length: int) -> int:
        return max(1, length) if self.block is None else self.block

    def aggregate(self, x: GradInput) -> Generator[Phase, np.ndarray, np.ndarray]:
        """Sum over workers of x, exact up to the fixed-point rounding (see docs/codecs.md)."""
        total, _ = yield from self._exchange(x, own_too=False)
        return total

    def compress(self, x: GradInput) -> Generator[Phase, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """One exchange; return (decoded sum, this worker's own dequantized contribution)."""
        return (yield from self._exchange(x, own_too=True))

    def _exchange(self, x: GradInput, own_too: bool):
        shape = output_shape(x)
        flat = to_dense(x)
        if flat.size == 0:
            return np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        block = self._block_of(flat.size)
        own = dense_exponents(flat, block)
        agreed = yield Phase(Op.MAX, own)
        ok = check_agreed(agreed, own)
        q = quantize_dense(flat, agreed, block, self.p) if ok else np.zeros(flat.size, np.int32)
        cells = np.concatenate([pack_lanes(q, self.bits, self.p), status_cell(ok)])
        summed = yield Phase(Op.ADD, cells)
        if summed.size != cells.size:
            raise CorruptResultError(f"{summed.size} cells received, {cells.size} sent")
        raise_on_status(summed[-1])
        sums = unpack_lanes(summed[:-1], flat.size, self.bits, self.p, self.world_size)
        total = dequantize_dense(sums, agreed, block, self.p)
        mine = dequantize_dense(q, agreed, block, self.p).reshape(shape) if own_too else None
        return total.reshape(shape), mine
