"""THC's random rotation: a randomized Hadamard transform per block of ROTATION_SIZE
elements, H·D with D random signs agreed by every worker (same seed, same call count).
It spreads a block's outliers over the block, so the block maximum (and with it the
quantum of block floating point) shrinks for heavy-tailed gradients. Orthonormal and
linear: the sum of rotated vectors is the rotated sum, and H·D inverts as D·H."""

from __future__ import annotations

import numpy as np

ROTATION_SIZE = 1024  # a power of two; 1/sqrt(1024) = 1/32 keeps the scaling exact
_SEED = 0x7A51  # every worker draws the same signs from (this, call number)


def hadamard(rows: np.ndarray) -> np.ndarray:
    """The orthonormal Walsh-Hadamard transform of every row (float32, rows of
    ROTATION_SIZE); its own inverse."""
    x = np.array(rows, dtype=np.float32, copy=True)
    m = x.shape[0]
    h = 1
    while h < ROTATION_SIZE:
        y = x.reshape(m, -1, 2, h)
        a = y[:, :, 0, :].copy()
        b = y[:, :, 1, :]
        y[:, :, 0, :] += b
        np.subtract(a, b, out=y[:, :, 1, :])
        h *= 2
    x *= np.float32(1 / np.sqrt(ROTATION_SIZE))
    return x


def rotation_signs(padded: int, call: int) -> np.ndarray:
    """The random signs D of one call, identical on every worker."""
    rng = np.random.default_rng([_SEED, call, padded])
    return (rng.integers(0, 2, padded, dtype=np.int8) * 2 - 1).astype(np.float32)


def rotate(flat: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """H·D of flat, zero-padded to len(signs) (a multiple of ROTATION_SIZE)."""
    padded = np.zeros(signs.size, np.float32)
    padded[: flat.size] = flat
    padded *= signs
    return hadamard(padded.reshape(-1, ROTATION_SIZE)).reshape(-1)


def unrotate(rotated: np.ndarray, signs: np.ndarray, length: int) -> np.ndarray:
    """D·H of rotated, cut back to `length` elements."""
    return (hadamard(rotated.reshape(-1, ROTATION_SIZE)).reshape(-1) * signs)[:length]


def padded_length(length: int) -> int:
    """length rounded up to whole rotation blocks."""
    return -(-length // ROTATION_SIZE) * ROTATION_SIZE
