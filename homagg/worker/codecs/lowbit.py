"""Low-bit lanes (issue 16; THC and CO3 in the network): block floating point with one
exponent per block agreed through MAX, values stochastically rounded to the lane width
minus the world's headroom, summed by the switch's ADD16 / ADD8 lane ops.

Per block with agreed exponent E (|v| < 2^E on every worker) and P = bits - 1 - ceil(log2 W)
magnitude bits, a worker sends q = clip(floor(v * 2^(P-E) + u), +-(2^P - 1)) with u uniform
in [0, 1): E[q] = v * 2^(P-E) (unbiased up to float32's rounding of the addition, below
2^-9 of a quantum; the clip only touches values within one quantum of 2^E),
|q - v * 2^(P-E)| <= 1, and W * |q| < 2^(bits-1), so a lane's sum never wraps.
Per-step bound, per element: |decoded sum - sum of v| <= W * 2^(E-P) (docs/codecs.md).
Option rounding="nearest" rounds to the nearest quantum instead (u = 1/2: biased, within
half a quantum), the quantizer error feedback exists for (CO3), for comparison."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from homagg.wire.constants import Op
from homagg.wire.lanes import join_lanes, split_lanes

from . import rotation
from .base import CorruptResultError, GradInput, Phase, output_shape, to_dense
from .exponent import (
    EXP_ZERO,
    check_agreed,
    dense_exponents,
    dequantize_dense,
    headroom_bits,
    raise_on_status,
    status_cell,
)

LOWBIT_OPS = {16: Op.ADD16, 8: Op.ADD8}
ROUNDINGS = ("stochastic", "nearest")
DEFAULT_LOWBIT_BLOCK = 1024  # elements per exponent: one MAX cell per 1024 lanes


def stochastic_quantize(
    flat: np.ndarray, exps: np.ndarray, block: int, p: int, rng: np.random.Generator | None
) -> np.ndarray:
    """q = clip(floor(v * 2^(P-E) + u), +-(2^P - 1)) per element (int32), E its block's
    agreed exponent: an unbiased rounding to P magnitude bits (u uniform in [0, 1) from
    rng; rng None: u = 1/2, rounding to nearest, biased)."""
    shifts = np.repeat(np.minimum(p - exps, 253), block)[: flat.size].astype(np.int32)
    first = np.minimum(shifts, 126)  # a float32 power of two; tiny blocks take two factors
    scaled = flat * np.ldexp(np.float32(1), first).astype(np.float32)
    rest = shifts - first
    if np.any(rest):
        scaled *= np.ldexp(np.float32(1), rest).astype(np.float32)
    scaled += rng.random(flat.size, dtype=np.float32) if rng is not None else np.float32(0.5)
    np.floor(scaled, out=scaled)
    np.clip(scaled, -(2**p - 1), 2**p - 1, out=scaled)
    return scaled.astype(np.int32)


def error_bound(world_size: int, exps: np.ndarray, bits: int) -> np.ndarray:
    """Per-block bound on |decoded sum - sum over workers of the inputs|: <= W * 2^(E-P)
    (0 for all-zero blocks)."""
    p = headroom_bits(world_size, bits)
    return np.where(exps == EXP_ZERO, 0.0, world_size * np.ldexp(1.0, exps - p))


class LowBit:
    """Block floating point in 16- or 8-bit lanes: MAX phase of block exponents, then one
    ADD16 / ADD8 phase of the stochastically rounded values plus a status cell. Lossy and
    unbiased; wrap it in ErrorFeedback (the registry's `lowbit16` / `lowbit8` do).
    `rotate=True` quantizes THC's randomized Hadamard rotation of x (codecs.rotation) and
    rotates the sum back: the bound then holds per rotated element, so per rotation block
    of 1024 the L2 error stays within sqrt(1024) * W * 2^(E-P). `rounding="nearest"`: a
    biased quantizer, half a quantum per worker at most (the bound holds a fortiori)."""

    def __init__(
        self,
        world_size: int,
        *,
        bits: int = 16,
        block: int = DEFAULT_LOWBIT_BLOCK,
        seed: int | None = None,
        rotate: bool = False,
        rounding: str = "stochastic",
    ):
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding is one of {', '.join(ROUNDINGS)}, not {rounding!r}")
        if bits not in LOWBIT_OPS:
            raise ValueError(f"lowbit lanes are 16 or 8 bits, not {bits}")
        if block < 1:
            raise ValueError(f"block must be >= 1, not {block}")
        self.world_size = world_size
        self.bits = bits
        self.op = LOWBIT_OPS[bits]
        self.block = block
        self.p = headroom_bits(world_size, bits)
        self.rng = np.random.default_rng(seed) if rounding == "stochastic" else None
        self.rotate = rotate
        self.calls = 0  # rotation signs change per call, alike on every worker (lockstep)

    def aggregate(self, x: GradInput) -> Generator[Phase, np.ndarray, np.ndarray]:
        """Sum over workers of x within error_bound (unbiased)."""
        total, _ = yield from self._exchange(x)
        return total

    def compress(self, x: GradInput) -> Generator[Phase, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """One exchange; return (decoded sum, this worker's own dequantized contribution)."""
        return (yield from self._exchange(x))

    def _exchange(self, x: GradInput):
        shape = output_shape(x)
        flat = to_dense(x)
        if flat.size == 0:
            return np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        if not self.rotate:
            return (yield from self._quantized_sum(flat, shape))
        signs = rotation.rotation_signs(rotation.padded_length(flat.size), self.calls)
        self.calls += 1
        total, mine = yield from self._quantized_sum(rotation.rotate(flat, signs), (signs.size,))
        back = [rotation.unrotate(v, signs, flat.size).reshape(shape) for v in (total, mine)]
        return back[0], back[1]

    def _quantized_sum(self, flat: np.ndarray, shape: tuple[int, ...]):
        own = dense_exponents(flat, self.block)
        agreed = yield Phase(Op.MAX, own)
        ok = check_agreed(agreed, own)
        if ok:
            q = stochastic_quantize(flat, agreed, self.block, self.p, self.rng)
        else:
            q = np.zeros(flat.size, np.int32)
        # The status cell's lane 0 counts the workers that saw a fault (<= 32 fits a lane).
        cells = np.concatenate([join_lanes(q, self.bits), status_cell(ok)])
        summed = yield Phase(self.op, cells)
        if summed.size != cells.size:
            raise CorruptResultError(f"{summed.size} cells received, {cells.size} sent")
        raise_on_status(summed[-1])
        sums = split_lanes(summed[:-1], self.bits)[: flat.size]
        total = dequantize_dense(sums, agreed, self.block, self.p)
        mine = dequantize_dense(q, agreed, self.block, self.p)
        return total.reshape(shape), mine.reshape(shape)
