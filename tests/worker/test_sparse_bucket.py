"""Sparse COO gradients to the codecs' flat indices and values, and the decoded sum back."""

from __future__ import annotations

import numpy as np
import torch

from worker.codecs import LosslessSparse, simulate
from worker.sparse_bucket import from_codec_output, to_codec_input


def test_rows_become_flat_runs_and_duplicates_add() -> None:
    g = torch.sparse_coo_tensor([[3, 1, 3]], torch.arange(6.0).reshape(3, 2), (5, 2))
    sg = to_codec_input(g)
    assert sg.length == 10 and sg.indices.tolist() == [2, 3, 6, 7]
    assert sg.values.tolist() == [2.0, 3.0, 4.0, 6.0]  # row 3: [0, 1] + [4, 5]


def test_empty_and_two_sparse_dims_round_trip() -> None:
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 4), (7, 4))
    sg = to_codec_input(empty)
    assert sg.indices.size == 0 and sg.length == 28
    back = from_codec_output(np.zeros(28, np.float32), empty)
    assert back.is_sparse and back._nnz() == 0 and back.shape == (7, 4)
    g2 = torch.sparse_coo_tensor([[0, 2], [1, 3]], torch.tensor([1.5, -2.0]), (3, 4))
    out = from_codec_output(np.asarray(g2.to_dense()).reshape(-1), g2)
    torch.testing.assert_close(out.to_dense(), g2.to_dense())


def test_through_a_codec_the_sum_is_exact() -> None:
    gs = [
        torch.sparse_coo_tensor([[r, 9]], torch.full((2, 3), float(r + 1)), (10, 3))
        for r in range(2)
    ]
    out = simulate([LosslessSparse(2) for _ in gs], [to_codec_input(g) for g in gs])
    summed = from_codec_output(out[0], gs[0])
    torch.testing.assert_close(summed.to_dense(), (gs[0] + gs[1]).to_dense())
    assert summed.coalesce().indices()[0].tolist() == [0, 1, 9]
