"""The driving interface shared by every codec: phases, the codec protocols, input forms
and errors."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from homagg.wire.constants import Op


@dataclass(frozen=True)
class Phase:
    """One switch round: every worker sends `cells` (int32, 1-D, the same length and op on
    every worker) and receives their element-wise combination under `op`."""

    op: Op
    cells: np.ndarray


class Codec(Protocol):
    """A per-worker codec object; `aggregate` is a generator driven in lockstep by a
    transport (or `simulate`)."""

    def aggregate(self, x: GradInput) -> Generator[Phase, np.ndarray, np.ndarray]:
        """Yield phases, receive each phase's combination over all workers; return the
        decoded sum over workers of x (float32, x's shape)."""
        ...


class LossyCodec(Codec, Protocol):
    """A codec whose single exchange also reports what this worker actually contributed,
    so that error feedback can keep the residual."""

    def compress(self, x: GradInput) -> Generator[Phase, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Like `aggregate`, without any internal memory; return (decoded sum, this
        worker's own contribution as the others decode it), both float32 of x's shape."""
        ...


class SparseGrad(NamedTuple):
    """A sparse flat gradient: `values` at `indices` of a length-`length` vector.
    Duplicate indices are summed (as torch's coalesce does)."""

    indices: np.ndarray
    values: np.ndarray
    length: int


GradInput = np.ndarray | SparseGrad | tuple[np.ndarray, np.ndarray, int]


class SparseRows(NamedTuple):
    """Rows of an (nrows, width) table, as an embedding's sparse gradient holds them:
    `values` (len(rows), width) float32 at the sorted unique row numbers `rows`. The rows
    are the support: a row whose values are all zero (looked up, its gradient zero) is
    still one of them."""

    rows: np.ndarray
    values: np.ndarray
    nrows: int


@runtime_checkable
class RowCodec(Codec, Protocol):
    """A codec that also sums rows in their own terms, in time proportional to the rows
    (homagg/worker/ddp/sparse_bucket.py uses it for sparse gradients when the bucket's codec has
    it)."""

    def aggregate_rows(self, x: SparseRows) -> Generator[Phase, np.ndarray, SparseRows]:
        """Yield phases like `aggregate`; return the sum over workers as rows: the union of
        every worker's rows (a row whose sum is zero kept) and their summed values."""
        ...


class CodecError(ValueError):
    """A step cannot be completed correctly (the same on every worker that sees the same
    switch results); never replaced by an approximation."""


class NonFiniteError(CodecError):
    """Some worker's gradient holds inf or nan (reported on every worker after the
    exponent phase)."""


class PeelingError(CodecError):
    """The count sketch could not be peeled within the allowed sketch sizes."""


class CorruptResultError(CodecError):
    """A combined result from the switch is inconsistent with the protocol (a corrupted or
    mixed-up aggregation)."""


def output_shape(x: GradInput) -> tuple[int, ...]:
    """Shape of the decoded sum for input x: x's shape, or (length,) for a sparse triple."""
    if isinstance(x, np.ndarray):
        return x.shape
    return (int(x[2]),)


_SCAN_CHUNK = 1 << 18


def nonzero_positions(flat: np.ndarray) -> np.ndarray:
    """np.flatnonzero(flat) for a big 1-D array, scanned in cache-sized chunks through a bool
    mask (flatnonzero is several times faster on bool; no full-size temporary)."""
    if flat.size <= _SCAN_CHUNK:
        return np.flatnonzero(flat != 0)
    mask = np.empty(_SCAN_CHUNK, dtype=bool)
    parts = []
    for start in range(0, flat.size, _SCAN_CHUNK):
        seg = flat[start : start + _SCAN_CHUNK]
        np.not_equal(seg, 0, out=mask[: seg.size])
        parts.append(np.flatnonzero(mask[: seg.size]) + start)
    return np.concatenate(parts)


def to_sparse(x: GradInput) -> tuple[np.ndarray, np.ndarray, int]:
    """Sorted unique int64 indices, their float32 values and the flat length; a dense array
    is scanned once with flatnonzero (explicit zeros are dropped in both forms)."""
    if isinstance(x, np.ndarray):
        flat = x.reshape(-1)
        if flat.dtype != np.float32:
            flat = flat.astype(np.float32)
        idx = nonzero_positions(flat)
        return idx, np.take(flat, idx), flat.size
    indices, values, length = x
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    vals = np.asarray(values, dtype=np.float32).reshape(-1)
    length = int(length)
    if idx.size != vals.size:
        raise ValueError(f"sparse gradient: {idx.size} indices but {vals.size} values")
    if idx.size and (idx.min() < 0 or idx.max() >= length):
        raise ValueError(f"sparse gradient: an index lies outside [0, {length})")
    if idx.size > 1 and not np.all(idx[1:] > idx[:-1]):
        order = np.argsort(idx, kind="stable")
        idx, vals = idx[order], vals[order]
        starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
        idx, vals = idx[starts], np.add.reduceat(vals, starts)
    keep = vals != 0
    if not keep.all():
        idx, vals = idx[keep], vals[keep]
    return idx, vals, length


def to_dense(x: GradInput) -> np.ndarray:
    """The flat float32 vector of x (a view when x is already flat float32)."""
    if isinstance(x, np.ndarray):
        flat = x.reshape(-1)
        return flat if flat.dtype == np.float32 else flat.astype(np.float32)
    idx, vals, length = to_sparse(x)
    out = np.zeros(length, dtype=np.float32)
    out[idx] = vals
    return out
