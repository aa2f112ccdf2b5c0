"""Sparse gradients as PyTorch makes them (nn.Embedding(sparse=True), EmbeddingBag): a COO
tensor handed to the codecs as rows or as flat indices and values, never densified on the
way, and the decoded sum turned back into the COO form DDP and the optimizers expect.

The sum holds the rows gloo's sparse all_reduce returns: every row any rank's gradient
names, also where the sum is zero (rows that cancel, rows of zeros). Optimizers with state
per row (SparseAdam) decay the moments of exactly those rows, so dropping zero rows would
change them. A codec that sums rows (`RowCodec`: the lossless codec) takes the rows as its
support keys, so its index phase is the rows' union and the sum comes back as rows: time
and cells in proportion to the rows touched, not to the table. After any other codec the
union rides as a bitmap at the end of the codec's first OR phase, or in one OR phase of its
own after a codec that has none, and the table-sized sum is scanned for its rows."""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np
import torch

from homagg.wire.constants import Op
from homagg.worker.codecs import (
    Codec,
    CorruptResultError,
    Phase,
    RowCodec,
    SparseGrad,
    SparseRows,
    bitmap,
)


def to_codec_input(grad: torch.Tensor) -> SparseGrad:
    """A sparse COO tensor (any sparse and dense dims) as a flat SparseGrad: each stored
    row's dense block occupies consecutive flat positions, as in the dense layout."""
    g = grad.coalesce()
    shape = tuple(g.shape)
    inner = math.prod(shape[g.sparse_dim() :])
    starts = _rows(g) * inner
    idx = (starts[:, None] + np.arange(inner, dtype=np.int64)).reshape(-1)
    vals = g.values().detach().to("cpu", torch.float32).reshape(-1).numpy()
    return SparseGrad(idx, vals, math.prod(shape))


def _rows(g: torch.Tensor) -> np.ndarray:
    """The flat row numbers (over the sparse dims) of a coalesced COO tensor, sorted."""
    rows = g.indices().cpu().numpy()
    if not rows.shape[1]:
        return np.zeros(0, np.int64)
    return np.ravel_multi_index(tuple(rows), tuple(g.shape[: g.sparse_dim()])).astype(np.int64)


def from_codec_output(out: np.ndarray, like: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """The decoded flat sum as a coalesced COO tensor shaped and typed like `like`, holding
    `rows` (the union of the ranks' rows, flat over the sparse dims, sorted) and any other
    row whose sum is nonzero (a lossy codec's error feedback can send one); scans the
    whole table."""
    blocks = np.asarray(out, np.float32).reshape(math.prod(like.shape[: like.sparse_dim()]), -1)
    keep = np.union1d(rows, np.flatnonzero(np.any(blocks != 0, axis=1))).astype(np.int64)
    return from_rows(keep, blocks[keep], like)


def from_rows(rows: np.ndarray, values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """Rows (flat over the sparse dims, sorted, unique) and their values (one row of the
    dense dims' elements each) as a coalesced COO tensor shaped and typed like `like`."""
    shape = tuple(like.shape)
    sd = like.sparse_dim()
    sparse_shape, dense_shape = shape[:sd], shape[sd:]
    indices = torch.from_numpy(np.stack(np.unravel_index(rows, sparse_shape)).astype(np.int64))
    vals = torch.from_numpy(np.asarray(values, np.float32).reshape((rows.size, *dense_shape)))
    return torch.sparse_coo_tensor(
        indices.reshape(sd, -1),
        vals.to(like.dtype),
        shape,
        device=like.device,
        is_coalesced=True,
        check_invariants=False,  # sorted, unique, in the table by construction
    )


class SparseBucket:
    """One sparse gradient on its way through a codec: `phases(codec)` for the transport
    (by rows when the codec sums rows, else flat with the row union beside), `result` to
    turn the sum back into COO."""

    def __init__(self, grad: torch.Tensor) -> None:
        self.like = grad
        self.coalesced = grad.coalesce()
        g = self.coalesced
        self.rows = _rows(g)
        self.nrows = math.prod(g.shape[: g.sparse_dim()])
        self.width = math.prod(g.shape[g.sparse_dim() :])
        self.union: np.ndarray | None = None
        self.by_rows = False

    def rows_input(self) -> SparseRows:
        """The gradient as rows: (stored rows, their values, the table's row count)."""
        vals = self.coalesced.values().detach().to("cpu", torch.float32)
        return SparseRows(self.rows, vals.reshape(self.rows.size, self.width).numpy(), self.nrows)

    def phases(self, codec: Codec) -> Generator[Phase, np.ndarray, np.ndarray]:
        """The phases of this gradient through `codec`; sets `union`; returns the sum (the
        union's rows' values from a RowCodec, else the codec's flat table-sized sum)."""
        if isinstance(codec, RowCodec):
            summed = yield from codec.aggregate_rows(self.rows_input())
            self.union, self.by_rows = summed.rows, True
            return summed.values
        return (yield from self.with_union(codec.aggregate(to_codec_input(self.coalesced))))

    def with_union(
        self, inner: Generator[Phase, np.ndarray, np.ndarray]
    ) -> Generator[Phase, np.ndarray, np.ndarray]:
        """A codec's phases with this rank's row bitmap appended to its first OR phase
        (or in an OR phase after them); sets `union`; returns the codec's sum."""
        words: np.ndarray | None = bitmap.pack(self.rows, self.nrows)
        try:
            phase = next(inner)
            while True:
                if words is not None and phase.op == Op.OR:
                    n = phase.cells.size
                    got = yield Phase(Op.OR, np.concatenate([phase.cells, words]))
                    reply = self._take_union(np.asarray(got), n)
                    words = None
                else:
                    reply = yield phase
                phase = inner.send(reply)
        except StopIteration as done:
            out = done.value
        if words is not None:
            got = yield Phase(Op.OR, words)
            self._take_union(np.asarray(got), 0)
        return out

    def _take_union(self, got: np.ndarray, n: int) -> np.ndarray:
        """The union from the combined cells past the codec's first `n`; those `n` back."""
        if got.size != n + bitmap.bitmap_words(self.nrows):
            raise CorruptResultError(f"{got.size} cells received for an OR phase of {n} + rows")
        union = bitmap.unpack(got[n:], self.nrows)
        if not np.all(np.isin(self.rows, union, assume_unique=True)):
            raise CorruptResultError("a row this rank sent is missing from the rows' union")
        self.union = union
        return got[:n]

    def result(self, out: np.ndarray) -> torch.Tensor:
        """The sum as coalesced COO with the union's rows (as gloo's sparse all_reduce)."""
        assert self.union is not None, "the phases have not run"
        if self.by_rows:
            return from_rows(self.union, out, self.like)
        return from_codec_output(out, self.like, self.union)
