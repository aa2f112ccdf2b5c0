"""A signed 3-hash count sketch over int32 cells, and its lossless decoding by peeling
(IBLT style), with a fingerprint that detects corrupted sums.

Keys are support rows (an element index, or a block index when the support is
block-granular with `width` elements per block): key r, element t of its block, goes with
sign s_i(r) into cell h_i(r) * width + t for i = 0, 1, 2. The rows are split into three
equal subtables and h_i maps into subtable i, so a key's three rows are always distinct
and a row's subtable names the hash that put a key there. Which keys peel, and in which
order, depends only on the keys and the hashes (row counts and key sums are computed
locally), never on the values: every worker can decide before sending that a sketch
will peel, and the decoding loop replays a fixed schedule, so a corrupted sum cannot
make it loop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import CorruptResultError

HASHES = 3
FINGERPRINT_CELLS = 2
_M1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer multipliers (odd)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15
_FINGERPRINT_SEED = 0x5EED_F1A6
_SHIFT = 40
_ONE = 1 << _SHIFT
_MASK = _ONE - 1
_CHUNK = 1 << 15  # keys hashed per pass: temporaries stay in cache
MAX_KEYS = 1 << 25  # keeps the packed peeling counters exact (see plan_peeling)


def mix64(keys: np.ndarray, seed: int) -> np.ndarray:
    """A well-mixed 64-bit hash of non-negative int keys (vectorized, seed-dependent)."""
    h = keys.astype(np.uint64)
    h += np.uint64((seed * _GOLDEN + 1) & 0xFFFFFFFFFFFFFFFF)
    t = np.empty_like(h)  # one temporary for the three shifts
    for shift, factor in ((30, _M1), (27, _M2), (31, None)):
        h ^= np.right_shift(h, np.uint64(shift), out=t)
        if factor is not None:
            h *= factor
    return h


@dataclass(frozen=True)
class SketchShape:
    """Geometry of one value phase: `rows` (a multiple of 3) of `width` cells, and the
    hash seed; agreed by all workers from shared data."""

    rows: int
    width: int
    seed: int

    @property
    def cells(self) -> int:
        """Sketch cells, without the fingerprint."""
        return self.rows * self.width


def hash_keys(keys: np.ndarray, shape: SketchShape) -> np.ndarray:
    """Codes (3, k) int32 of keys under the shape's seed: row h_i(key) << 1 | (sign < 0).
    One array for rows and signs: peeling gathers it at random keys, and memory latency
    is the cost there. Computed in cache-sized chunks (no big temporaries)."""
    m = np.uint64(shape.rows // HASHES)
    hi, lo32, one = np.uint64(32), np.uint64(0xFFFFFFFF), np.uint64(1)
    offsets = (np.arange(HASHES, dtype=np.uint64) * m)[:, None]
    codes = np.empty((HASHES, keys.size), dtype=np.int32)
    rows = np.empty((HASHES, min(keys.size, _CHUNK)), dtype=np.uint64)
    for start in range(0, keys.size, _CHUNK):
        part = keys[start : start + _CHUNK]
        r = rows[:, : part.size]
        a = mix64(part, 2 * shape.seed)
        b = mix64(part, 2 * shape.seed + 1)
        np.right_shift(a, hi, out=r[0])
        np.bitwise_and(a, lo32, out=r[1])
        np.right_shift(b, hi, out=r[2])
        # Lemire's multiply-shift maps each 32-bit hash into [0, m), then subtable i's offset.
        r *= m
        r >>= hi
        r += offsets
        r <<= one
        for i in range(HASHES):  # bits 0-2 of b: the signs
            r[i] |= (b >> np.uint64(i)) & one
        codes[:, start : start + part.size] = r
    return codes


def split_codes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows and +1/-1 signs (int32) of hash codes."""
    return codes >> 1, 1 - 2 * (codes & 1)


def encode(keys: np.ndarray, cols: np.ndarray, q: np.ndarray, shape: SketchShape) -> np.ndarray:
    """The int32 sketch (wrapping sums) of values q of elements (keys, cols); O(len(q))
    besides zeroing the cells. Keys must be sorted (elements in index order)."""
    if q.size == 0:
        return np.zeros(shape.cells, dtype=np.int32)
    if shape.width == 1:
        rows, signs = split_codes(hash_keys(keys, shape))
    else:  # hash each distinct key once: the elements of one block share it
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        owner = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, keys.size]))
        rows, signs = split_codes(np.take(hash_keys(keys[starts], shape), owner, axis=1))
        rows = rows.astype(np.int64) * shape.width + cols
    weights = signs * q.astype(np.float64)
    # float64 sums are exact (|sum| < 2^53); the int32 cast then wraps modulo 2^32.
    sums = np.bincount(rows.ravel(), weights=weights.ravel(), minlength=shape.cells)
    return sums.astype(np.int64).astype(np.int32)


@dataclass
class PeelPlan:
    """The peeling schedule: per round, the keys decoded, the pure row each is read
    from, and the keys' hash codes (3, c) so that decoding reads them in sequence."""

    shape: SketchShape
    keys: int
    rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def plan_peeling(keys: np.ndarray, shape: SketchShape) -> PeelPlan | None:
    """The peeling schedule of the union keys under `shape`, or None when peeling stalls
    (a non-empty 2-core). Each round decodes every key that sits alone in some row."""
    k = keys.size
    if k > MAX_KEYS:
        raise ValueError(f"{k} sketch keys exceed {MAX_KEYS}; use a block-granular support")
    codes = hash_keys(keys, shape)
    # One packed counter per row: count << 40 | sum of the ranks of its keys (IBLT's key
    # sum; in a row of count 1 it names the lone key). Ranks < 2^25 and counts < 2^13 keep
    # it below 2^53, so float64 bincount is exact.
    tag = np.arange(k, dtype=np.float64) + _ONE
    packed: np.ndarray = np.zeros(shape.rows, dtype=np.float64)
    for i in range(HASHES):
        packed += np.bincount(codes[i] >> 1, weights=tag, minlength=shape.rows)
    if packed.max() >= 2.0**53:  # absurdly overloaded rows (a hopeless geometry): reject
        return None
    packed = packed.astype(np.int64)
    owner = np.empty(k, dtype=np.int64)
    rounds = []
    decoded = 0
    cand = np.flatnonzero((packed >> _SHIFT) == 1)
    # np.take / np.compress instead of fancy indexing: several times faster on big arrays.
    while cand.size:
        pc = np.take(packed, cand)
        pure = (pc >> _SHIFT) == 1
        cand, el = np.compress(pure, cand), np.compress(pure, pc) & _MASK
        if cand.size == 0:
            break
        pos = np.arange(el.size)
        owner[el] = pos  # a key pure in two rows keeps exactly one of them
        keep = np.take(owner, el) == pos
        el, pivot = np.compress(keep, el), np.compress(keep, cand)
        got = np.empty((HASHES, el.size), dtype=np.int32)
        for i in range(HASHES):
            np.take(codes[i], el, out=got[i])
        rounds.append((el, pivot, got))
        decoded += el.size
        touched = (got >> 1).astype(np.intp)
        tagged = el + _ONE
        for i in range(HASHES):
            np.subtract.at(packed, touched[i], tagged)
        cand = touched.ravel()
    if decoded != k:
        return None
    return PeelPlan(shape, k, rounds)


def decode(plan: PeelPlan, sums: np.ndarray) -> np.ndarray:
    """Per-key value rows (k, width) int32 from the combined sketch, replaying the plan.
    Raises CorruptResultError if any cell is left nonzero (sums not of a sketch of these
    keys)."""
    shape = plan.shape
    width = shape.width
    m = shape.rows // HASHES
    if sums.size != shape.cells:
        raise CorruptResultError(f"{sums.size} sketch cells received, {shape.cells} expected")
    s = sums.astype(np.int32, copy=True)
    values = np.zeros((plan.keys, width), dtype=np.int32)
    cols = np.arange(width)
    for el, pivot, got in plan.rounds:
        rows, signs = split_codes(got)
        rows = rows.astype(np.intp)
        c = el.size
        # the pivot row lies in subtable pivot // m, so that hash's sign applies
        sign = np.take(signs.ravel(), (pivot // m) * c + np.arange(c))
        if width == 1:
            val = np.take(s, pivot) * sign
            values[el, 0] = val
            signs *= val
            for i in range(HASHES):
                np.subtract.at(s, rows[i], signs[i])
        else:
            val = np.take(s, pivot[:, None] * width + cols) * sign[:, None]
            values[el] = val
            for i in range(HASHES):
                cells = rows[i].astype(np.int64)[:, None] * width + cols
                np.subtract.at(s, cells.ravel(), (signs[i][:, None] * val).ravel())
    if np.any(s):
        raise CorruptResultError(
            f"sketch sum is corrupt: {np.count_nonzero(s)} cells left after peeling every key"
        )
    return values


def fingerprint(elements: np.ndarray, q: np.ndarray) -> np.ndarray:
    """FINGERPRINT_CELLS int32 cells: sums over elements of c_j * q_j mod 2^32 with
    pseudo-random c_j; linear, so it survives the switch's ADD and checks the decode."""
    if elements.size == 0:
        return np.zeros(FINGERPRINT_CELLS, dtype=np.int32)
    # odd halves: a change of one cell by d * 2^k (d odd, k < 32) moves both sums, so no
    # single flipped bit goes unseen (even multipliers lost the top bits' flips)
    c = mix64(elements, _FINGERPRINT_SEED)
    c |= np.uint64(0x0000000100000001)
    # Each sum is taken mod 2^32, so 32-bit products suffice: q's two's complement bits
    # against c's low and high halves (little-endian words 0 and 1), wrapping as the switch.
    halves = c.astype("<u8", copy=False).view("<u4").reshape(-1, 2)
    return np.dot(np.asarray(q, np.int32).view(np.uint32), halves).view(np.int32)
