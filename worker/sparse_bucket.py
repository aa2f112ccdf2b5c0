"""Sparse gradients as PyTorch makes them (nn.Embedding(sparse=True), EmbeddingBag): a COO
tensor handed to the codecs as flat indices and values, never densified on the way, and the
decoded sum turned back into the COO form DDP and the optimizers expect."""

from __future__ import annotations

import math

import numpy as np
import torch

from worker.codecs import SparseGrad


def to_codec_input(grad: torch.Tensor) -> SparseGrad:
    """A sparse COO tensor (any sparse and dense dims) as a flat SparseGrad: each stored
    row's dense block occupies consecutive flat positions, as in the dense layout."""
    g = grad.coalesce()
    shape = tuple(g.shape)
    sparse_shape, dense_shape = shape[: g.sparse_dim()], shape[g.sparse_dim() :]
    inner = math.prod(dense_shape)
    rows = g.indices().cpu().numpy()
    if rows.shape[1]:
        starts = np.ravel_multi_index(tuple(rows), sparse_shape).astype(np.int64) * inner
    else:
        starts = np.zeros(0, np.int64)
    idx = (starts[:, None] + np.arange(inner, dtype=np.int64)).reshape(-1)
    vals = g.values().detach().to("cpu", torch.float32).reshape(-1).numpy()
    return SparseGrad(idx, vals, math.prod(shape))


def from_codec_output(out: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """The decoded flat sum as a coalesced COO tensor shaped and typed like `like`, holding
    the rows whose sum is nonzero (rows summing to zero change no parameter)."""
    shape = tuple(like.shape)
    sd = like.sparse_dim()
    sparse_shape, dense_shape = shape[:sd], shape[sd:]
    blocks = np.asarray(out, np.float32).reshape(math.prod(sparse_shape), -1)
    keep = np.flatnonzero(np.any(blocks != 0, axis=1))
    indices = torch.from_numpy(np.stack(np.unravel_index(keep, sparse_shape)).astype(np.int64))
    values = torch.from_numpy(blocks[keep].reshape((keep.size, *dense_shape)).copy())
    result = torch.sparse_coo_tensor(
        indices.reshape(sd, -1),
        values.to(like.dtype),
        shape,
        device=like.device,
        is_coalesced=True,
    )
    return result
