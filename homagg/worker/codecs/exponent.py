"""The exponent rule every codec shares (SwitchML): per-block exponents agreed with a MAX
phase, power-of-two scales chosen so that the W-worker sum cannot overflow, and the status
cell that turns one worker's local fault into the same error on every worker.

A block's exponent is the smallest E with |x| < 2^E for all its elements on all workers
(frexp's exponent of the block max, agreed with MAX); with P = bits - 1 - ceil(log2 W)
headroom bits, q = rint(x * 2^(P - E)) so |q| <= 2^P - 1 and W * |q| < 2^(bits - 1): the
sum never wraps. Decoding is sum * 2^(E - P)."""

from __future__ import annotations

import numpy as np

from .base import CorruptResultError, NonFiniteError

# Elements per exponent: fixed, not tied to the packet's cell count, so that the quantized
# values (and the sums) do not depend on how the P4 program was compiled.
DEFAULT_BLOCK = 16384
EXP_ZERO = -256  # an all-zero block (float32 exponents are >= -148)
EXP_NONFINITE = 1 << 30  # a worker saw inf or nan in this block
_EXP_LIMIT = 128  # frexp exponent of the largest finite float32 (~2^128)


def headroom_bits(world_size: int, bits: int = 32) -> int:
    """P, the magnitude bits of one worker's quantized value, so that W of them summed
    fit `bits`-bit signed lanes (31 - ceil(log2 W) for int32 cells)."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, not {world_size}")
    p = bits - 1 - (world_size - 1).bit_length()  # (W - 1).bit_length() == ceil(log2 W)
    if p < 1:
        raise ValueError(f"{bits}-bit lanes leave no magnitude bits for {world_size} workers")
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
    # A block's exponent is its largest |x|'s (frexp's exponent grows with |x|; a NaN or
    # an inf makes the largest non-finite), as dense_exponents takes it.
    amax = np.zeros(num_blocks(length, block), dtype=np.float32)
    if idx.size:
        mags = np.abs(np.asarray(vals, np.float32))
        blocks = idx // block
        runs = np.flatnonzero(blocks[1:] != blocks[:-1]) + 1 if idx.size > 4096 else None
        if runs is not None and np.all(blocks[runs] > blocks[runs - 1]):  # sorted: a run a block
            starts = np.r_[0, runs]
            amax[blocks[starts]] = np.maximum.reduceat(mags, starts)
        else:
            np.maximum.at(amax, blocks, mags)
    return _encode_exponents(amax)


# Exponents as bits, so that OR agrees their MAX (the highest bit set) in a phase that also
# carries other OR cells: bit e - _EXP_MIN for a finite exponent, the top bit for inf/nan,
# none for an all-zero block; 9 words per block.
_EXP_MIN = -149
EXP_BIT_WORDS = 9
_NONFINITE_BIT = 32 * EXP_BIT_WORDS - 1
# bits 278..286 (exponents 129..137) of the last word: never set by a worker
_UNUSED_TOP_WORD = np.uint32(((1 << 31) - 1) & ~((1 << (_EXP_LIMIT - _EXP_MIN + 1 - 256)) - 1))


def exponents_as_bits(exps: np.ndarray) -> np.ndarray:
    """Each block's exponent as one set bit in EXP_BIT_WORDS int32 words (none: EXP_ZERO)."""
    exps = np.asarray(exps, np.int64)
    bits = np.where(exps == EXP_NONFINITE, _NONFINITE_BIT, exps - _EXP_MIN)
    words = np.zeros((exps.size, EXP_BIT_WORDS), np.uint32)
    set_ = np.flatnonzero(exps != EXP_ZERO)
    words[set_, bits[set_] // 32] = np.left_shift(np.uint32(1), (bits[set_] % 32).astype(np.uint32))
    return words.reshape(-1).view(np.int32)


def exponents_from_bits(words: np.ndarray, blocks: int) -> np.ndarray:
    """The MAX exponent of each block from the OR of every worker's `exponents_as_bits`:
    its highest bit. A bit no exponent uses is a CorruptResultError, so a corrupted top
    word reads as a worker's inf or nan (NonFiniteError) only 2^-9 as often as not."""
    if words.size != blocks * EXP_BIT_WORDS:
        raise CorruptResultError(f"{words.size} exponent words received, {blocks} blocks")
    w = np.asarray(words).view(np.uint32).reshape(blocks, EXP_BIT_WORDS)
    if np.any(w[:, -1] & _UNUSED_TOP_WORD):  # no worker sets these: a corrupt result
        raise CorruptResultError("exponent bits no exponent uses are set: the OR is corrupt")
    nonzero = w != 0
    top = EXP_BIT_WORDS - 1 - np.argmax(nonzero[:, ::-1], axis=1)
    word = w[np.arange(blocks), top].astype(np.float64)
    bit = 32 * top + np.frexp(word)[1].astype(np.int64) - 1
    exps = np.where(bit == _NONFINITE_BIT, EXP_NONFINITE, bit + _EXP_MIN)
    return np.where(nonzero.any(axis=1), exps, EXP_ZERO).astype(np.int32)


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


def raise_on_status(cell: int | np.integer) -> None:
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
    return _rounded(scaled, p)


def _rounded(scaled: np.ndarray, p: int) -> np.ndarray:
    """The scaled values rounded to the nearest int32 (in place), |q| <= 2^p - 1."""
    np.rint(scaled, out=scaled)
    # For p >= 24 clipping is a no-op: |x| < 2^E with a 24-bit mantissa gives
    # |x * 2^(p-E)| <= 2^p - 2^(p-24), an integer, so rint cannot reach 2^p.
    if p < 24:
        np.clip(scaled, -(2**p - 1), 2**p - 1, out=scaled)
    return scaled.astype(np.int32)


def quantize_at(vals: np.ndarray, exps: np.ndarray, blocks: np.ndarray, p: int) -> np.ndarray:
    """quantize(vals, p - exps[blocks], p), bit for bit, with the powers of two computed
    once per block and gathered (a sparse tensor's nonzeros: `blocks` their blocks)."""
    shift = np.minimum(p - np.asarray(exps, np.int64), 253)
    first = np.minimum(shift, 126)
    scaled = vals * np.take(_pow2_f32(first), blocks)
    # As quantize, a second exact factor for tiny blocks (1.0, exact, for the others); an
    # all-zero block holds no nonzero unless the agreement failed, which every worker sees.
    if np.any((shift > 126) & (np.asarray(exps) != EXP_ZERO)):
        scaled *= np.take(_pow2_f32(shift - first), blocks)
    return _rounded(scaled, p)


def dequantize_at(sums: np.ndarray, shifts: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """dequantize(sums, shifts[blocks]), bit for bit, the power of two computed once per
    block and gathered; the per-element path where a block decodes into subnormals."""
    if np.any(shifts < -126) and np.any(np.take(shifts, blocks) < -126):
        return dequantize(sums, np.take(shifts, blocks))
    return sums.astype(np.float32) * np.take(_pow2_f32(np.clip(shifts, -126, 127)), blocks)


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
