"""Sparse gradients as PyTorch makes them (nn.Embedding(sparse=True), EmbeddingBag): a COO
tensor handed to the codecs as flat indices and values, never densified on the way, and the
decoded sum turned back into the COO form DDP and the optimizers expect.

The sum holds the rows gloo's sparse all_reduce returns: every row any rank's gradient
names, also where the sum is zero (rows that cancel, rows of zeros). Optimizers with state
per row (SparseAdam) decay the moments of exactly those rows, so dropping zero rows would
change them. The union of the rows rides as a bitmap at the end of the codec's first OR
phase (the lossless codec's support phase: no extra round trip), or in one OR phase of its
own after a codec that has none."""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np
import torch

from aggwire.constants import Op
from worker.codecs import CorruptResultError, Phase, SparseGrad, bitmap


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
    row whose sum is nonzero."""
    shape = tuple(like.shape)
    sd = like.sparse_dim()
    sparse_shape, dense_shape = shape[:sd], shape[sd:]
    blocks = np.asarray(out, np.float32).reshape(math.prod(sparse_shape), -1)
    keep = np.union1d(rows, np.flatnonzero(np.any(blocks != 0, axis=1))).astype(np.int64)
    indices = torch.from_numpy(np.stack(np.unravel_index(keep, sparse_shape)).astype(np.int64))
    values = torch.from_numpy(blocks[keep].reshape((keep.size, *dense_shape)).copy())
    return torch.sparse_coo_tensor(
        indices.reshape(sd, -1),
        values.to(like.dtype),
        shape,
        device=like.device,
        is_coalesced=True,
    )


class SparseBucket:
    """One sparse gradient on its way through a codec: `grad` for the codec, `phases` to
    wrap the codec's phases with the row union, `result` to turn the sum back into COO."""

    def __init__(self, grad: torch.Tensor) -> None:
        self.like = grad
        g = grad.coalesce()
        self.grad = to_codec_input(g)
        self.rows = _rows(g)
        self.nrows = math.prod(g.shape[: g.sparse_dim()])
        self.union: np.ndarray | None = None

    def phases(
        self, inner: Generator[Phase, np.ndarray, np.ndarray]
    ) -> Generator[Phase, np.ndarray, np.ndarray]:
        """The codec's phases with this rank's row bitmap appended to its first OR phase
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
        return from_codec_output(out, self.like, self.union)
