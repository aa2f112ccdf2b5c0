"""SwitchML-style fixed point: per-block exponents agreed with a MAX phase, power-of-two
scales chosen so that the W-worker sum cannot overflow, and the dense fixed-point codec.

Rule (shared by every codec here): a block's exponent is the smallest E with |x| < 2^E for
all its elements on all workers (frexp's exponent of the block max, agreed with MAX); with
P = bits - 1 - ceil(log2 W) headroom bits, q = rint(x * 2^(P - E)) so |q| <= 2^P - 1 and
W * |q| < 2^(bits - 1): the sum never wraps. Decoding is sum * 2^(E - P)."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from aggwire.constants import Op

from .base import CorruptResultError, GradInput, NonFiniteError, Phase, output_shape, to_dense

DEFAULT_BLOCK = 64 * 256  # elements per exponent: 256 packets of 64 cells
EXP_ZERO = -256  # an all-zero block (float32 exponents are >= -148)
EXP_NONFINITE = 1 << 30  # a worker saw inf or nan in this block
_EXP_LIMIT = 128  # frexp exponent of the largest finite float32 (~2^128)
LANE_BITS = (2, 4, 8, 16, 32)


def headroom_bits(world: int, bits: int = 32) -> int:
    """P, the magnitude bits of one worker's quantized value, so that W of them summed
    fit `bits`-bit signed lanes (31 - ceil(log2 W) for int32 cells)."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, not {world}")
    p = bits - 1 - (world - 1).bit_length()  # (W - 1).bit_length() == ceil(log2 W)
    if p < 1:
        raise ValueError(f"{bits}-bit lanes leave no magnitude bits for {world} workers")
    return p


def num_blocks(length: int, block: int) -> int:
    """Number of exponent blocks over a flat length."""
    return max(1, -(-length // block))


def _encode_exponents(amax: np.ndarray) -> np.ndarray:
    _, e = np.frexp(amax.astype(np.float32, copy=False))
    e = np.where(amax == 0, EXP_ZERO, e)
    return np.where(np.isfinite(amax), e, EXP_NONFINITE).astype(np.int32)


def dense_exponents(flat: np.ndarray, block: int) -> np.ndarray:
    """Per-block exponents (EXP_ZERO, EXP_NONFINITE markers) of a flat float32 vector."""
    full = flat.size // block
    parts = []
    if full:
        rows = flat[: full * block].reshape(full, block)
        parts.append(np.maximum(rows.max(axis=1), -rows.min(axis=1)))
    if flat.size % block or flat.size == 0:
        tail = flat[full * block :]
        parts.append(np.array([np.abs(tail).max() if tail.size else 0.0], dtype=np.float32))
    return _encode_exponents(np.concatenate(parts))


def sparse_exponents(idx: np.ndarray, vals: np.ndarray, length: int, block: int) -> np.ndarray:
    """The same per-block exponents computed from the nonzeros only (O(nnz + blocks))."""
    out = np.full(num_blocks(length, block), EXP_ZERO, dtype=np.int32)
    if idx.size:
        _, e = np.frexp(vals)
        e = np.where(np.isfinite(vals), e, EXP_NONFINITE).astype(np.int32)
        np.maximum.at(out, idx // block, e)
    return out


def check_agreed(agreed: np.ndarray, own: np.ndarray) -> bool:
    """Validate the MAX-combined exponents. Raises what every worker sees alike
    (NonFiniteError if any worker saw inf/nan, CorruptResultError for impossible values);
    returns False if the result lies below this worker's own exponents, a fault only this
    worker can see: it then reports it in its next phase's status cell (see STATUS_*)."""
    if own.size != agreed.size:
        raise CorruptResultError(f"{agreed.size} exponents received, {own.size} expected")
    # Exactly the marker: a corrupted exponent above the limit is not an inf/nan report.
    if np.any(agreed == EXP_NONFINITE):
        raise NonFiniteError("a worker's gradient holds inf or nan; no worker can aggregate it")
    if np.any(agreed > _EXP_LIMIT) or np.any((agreed < -149) & (agreed != EXP_ZERO)):
        raise CorruptResultError("exponent phase result holds impossible exponents")
    return not np.any(agreed < own)


def status_cell(ok: bool) -> np.ndarray:
    """One int32 cell appended to a phase: 0, or 1 when this worker saw a local fault; any
    nonzero combination (ADD or OR) makes every worker raise the same error."""
    return np.array([0 if ok else 1], dtype=np.int32)


def raise_on_status(cell: np.integer) -> None:
    """Raise CorruptResultError on every worker if some worker reported a local fault."""
    if cell != 0:
        raise CorruptResultError(
            "a worker received exponents below its own: the MAX result is corrupt"
        )


def _pow2_f32(shift: np.ndarray) -> np.ndarray:
    return np.ldexp(np.float32(1.0), shift.astype(np.int32)).astype(np.float32)


def quantize(vals: np.ndarray, shift: np.ndarray, p: int) -> np.ndarray:
    """q = rint(vals * 2^shift) as int32, |q| <= 2^p - 1; `shift` (= P - E) broadcasts
    against vals. Exact: products by powers of two lose nothing where |q| >= 1."""
    shift = np.minimum(shift, 253)  # EXP_ZERO blocks hold only zeros; keep 2^s finite
    first = np.minimum(shift, 126)
    scaled = vals * _pow2_f32(first)
    if np.any(shift > 126):  # tiny blocks: split the power so each factor is a float32
        scaled *= _pow2_f32(shift - first)
    np.rint(scaled, out=scaled)
    # For p >= 24 clipping is a no-op: |x| < 2^E with a 24-bit mantissa gives
    # |x * 2^(p-E)| <= 2^p - 2^(p-24), an integer, so rint cannot reach 2^p.
    if p < 24:
        np.clip(scaled, -(2**p - 1), 2**p - 1, out=scaled)
    return scaled.astype(np.int32)


def dequantize(sums: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """float32(sums * 2^shift), correctly rounded; `shift` (= E - P) broadcasts against sums."""
    shift = np.maximum(shift, -300)
    out = sums.astype(np.float32) * _pow2_f32(np.clip(shift, -126, 127))
    low = shift < -126
    if np.any(low):  # results in float32's subnormal range: round once, from float64
        full_shift = np.broadcast_to(shift, out.shape)
        mask = np.broadcast_to(low, out.shape)
        out[mask] = np.ldexp(sums[mask].astype(np.float64), full_shift[mask]).astype(np.float32)
    return out


def decode_shifts(exps: np.ndarray, p: int) -> np.ndarray:
    """Per-block decode shifts E - P (all-zero blocks decode with shift 0: their sums are 0)."""
    return np.where(exps == EXP_ZERO, 0, exps - p).astype(np.int32)


def _blockwise(fn, flat: np.ndarray, per_block: np.ndarray, block: int) -> np.ndarray:
    """Apply fn(values, per-block scalar) block by block through broadcasting."""
    full = flat.size // block
    parts = []
    if full:
        rows = flat[: full * block].reshape(full, block)
        parts.append(fn(rows, per_block[:full, None]).reshape(-1))
    if flat.size % block:
        parts.append(fn(flat[full * block :], per_block[full]))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def quantize_dense(flat: np.ndarray, exps: np.ndarray, block: int, p: int) -> np.ndarray:
    """Quantize a flat float32 vector with its agreed per-block exponents."""
    return _blockwise(lambda v, s: quantize(v, s, p), flat, p - exps, block)


def dequantize_dense(sums: np.ndarray, exps: np.ndarray, block: int, p: int) -> np.ndarray:
    """Decode a flat vector of sums with the agreed per-block exponents."""
    return _blockwise(dequantize, sums, decode_shifts(exps, p), block)


def pack_lanes(q: np.ndarray, bits: int, p: int) -> np.ndarray:
    """Pack 32/bits offset-binary lanes per int32 cell; W lane sums stay below 2^bits, so
    the switch's per-cell wrapping ADD never carries between lanes."""
    if bits == 32:
        return q
    lanes = 32 // bits
    u = (q.astype(np.int64) + (1 << p)).astype(np.uint32)
    u = np.concatenate([u, np.full(-u.size % lanes, 1 << p, dtype=np.uint32)])
    shifts = bits * np.arange(lanes, dtype=np.uint32)
    cells = np.bitwise_or.reduce(u.reshape(-1, lanes) << shifts, axis=1)
    return cells.astype(np.uint32).view(np.int32)


def unpack_lanes(cells: np.ndarray, length: int, bits: int, p: int, world: int) -> np.ndarray:
    """Lane sums of combined cells back to per-element int64 sums of q."""
    if bits == 32:
        return cells
    lanes = 32 // bits
    shifts = bits * np.arange(lanes, dtype=np.uint32)
    u = (cells.view(np.uint32)[:, None] >> shifts) & np.uint32((1 << bits) - 1)
    return u.reshape(-1)[:length].astype(np.int64) - world * (1 << p)


def lane_cells(length: int, bits: int) -> int:
    """int32 cells that carry `length` lanes of `bits` bits."""
    return -(-length // (32 // bits))


class FixedPoint:
    """Dense fixed-point codec (SwitchML): MAX phase of block exponents, then one ADD phase
    of every element's quantized value plus a status cell (bits < 32 packs several lanes
    per cell: lossy)."""

    def __init__(self, world: int, *, bits: int = 32, block: int | None = DEFAULT_BLOCK):
        if bits not in LANE_BITS:
            raise ValueError(f"bits must be one of {LANE_BITS}, not {bits}")
        self.world = world
        self.bits = bits
        self.block = block
        self.p = headroom_bits(world, bits)

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
        sums = unpack_lanes(summed[:-1], flat.size, self.bits, self.p, self.world)
        total = dequantize_dense(sums, agreed, block, self.p)
        mine = dequantize_dense(q, agreed, block, self.p).reshape(shape) if own_too else None
        return total.reshape(shape), mine
