"""Support bitmaps packed into int32 words (bit i of word w is position 32*w + i), the
payload of the OR index phase."""

from __future__ import annotations

import numpy as np

from .base import CorruptResultError

BITS_PER_WORD = 32
DENSE_BITS = 8  # positions for at least 1/8 of the bits: pack a mask instead of runs
SMALL_BITS = 4096  # up to this many positions: ufunc.at beats finding the words' runs


def bitmap_words(length: int) -> int:
    """Number of int32 words of a bitmap over `length` positions."""
    return -(-length // BITS_PER_WORD)


def pack(positions: np.ndarray, length: int) -> np.ndarray:
    """The int32 bitmap of sorted unique positions in [0, length); touches only the
    positions plus the O(length/32) zeroed words."""
    if positions.size * DENSE_BITS >= length:  # dense: a byte a position, packed
        mask = np.zeros(bitmap_words(length) * BITS_PER_WORD, dtype=bool)
        mask[positions] = True
        return np.packbits(mask, bitorder="little").view("<i4").astype(np.int32, copy=False)
    words = np.zeros(bitmap_words(length), dtype=np.uint32)
    if not positions.size:
        return words.view(np.int32)
    pos = positions.astype(np.int64, copy=False)
    word = pos >> 5
    bits = np.left_shift(np.uint32(1), (pos & 31).astype(np.uint32))
    if pos.size <= SMALL_BITS:  # a few positions: OR them in place
        np.bitwise_or.at(words, word, bits)
    else:  # sorted positions: each word's bits form one run, OR-reduced
        starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
        words[word[starts]] = np.bitwise_or.reduceat(bits, starts)
    return words.view(np.int32)


def unpack(words: np.ndarray, length: int) -> np.ndarray:
    """Sorted int64 positions of the set bits: O(length/32) to find the nonzero bytes, then
    O(8 per nonzero byte). Raises CorruptResultError for bits at or beyond `length`."""
    if words.size != bitmap_words(length):
        raise CorruptResultError(f"bitmap has {words.size} words, expected {bitmap_words(length)}")
    b = words.astype("<i4", copy=False).view(np.uint8)  # byte j holds bits 8j..8j+7
    # flatnonzero is several times faster on bool arrays than on uint8 ones.
    nz = np.flatnonzero(b != 0)
    if nz.size == 0:
        return np.zeros(0, dtype=np.int64)
    if nz.size > b.size // 3:  # dense support: unpacking everything is cheaper
        positions = np.flatnonzero(np.unpackbits(b, bitorder="little").view(bool))
    else:
        bits = np.flatnonzero(np.unpackbits(np.take(b, nz), bitorder="little").view(bool))
        positions = np.take(nz, bits >> 3) * 8 + (bits & 7)
    if positions[-1] >= length:
        raise CorruptResultError(f"bitmap has a bit at {positions[-1]}, beyond length {length}")
    return positions
