"""Sparse COO gradients to the codecs' flat indices and values (what a codec receives: never
a dense array), and the decoded sum back with the rows gloo's sparse all_reduce keeps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from homagg.lab.processes import run_together
from homagg.wire.constants import Op
from homagg.worker.codecs import bitmap, make_codec
from homagg.worker.codecs.exponent import EXP_BIT_WORDS
from homagg.worker.codecs.simulate import drive
from homagg.worker.ddp.sparse_bucket import SparseBucket, from_codec_output, to_codec_input


def test_rows_become_flat_runs_and_duplicates_add() -> None:
    g = torch.sparse_coo_tensor([[3, 1, 3]], torch.arange(6.0).reshape(3, 2), (5, 2))
    sg = to_codec_input(g)
    assert sg.length == 10 and sg.indices.tolist() == [2, 3, 6, 7]
    assert sg.values.tolist() == [2.0, 3.0, 4.0, 6.0]  # row 3: [0, 1] + [4, 5]


def test_empty_and_two_sparse_dims_round_trip() -> None:
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 4), (7, 4))
    sg = to_codec_input(empty)
    assert sg.indices.size == 0 and sg.length == 28
    back = from_codec_output(np.zeros(28, np.float32), empty, np.zeros(0, np.int64))
    assert back.is_sparse and back._nnz() == 0 and back.shape == (7, 4)
    g2 = torch.sparse_coo_tensor([[0, 2], [1, 3]], torch.tensor([1.5, -2.0]), (3, 4))
    out = from_codec_output(np.asarray(g2.to_dense()).reshape(-1), g2, np.array([1, 11]))
    torch.testing.assert_close(out.to_dense(), g2.to_dense())


ROOT = Path(__file__).resolve().parents[2]


def through(codec: str, gs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each rank's sum of the sparse gradients `gs` by `codec` with the rows' union, the
    ranks' phases combined as the switch does."""
    buckets = [SparseBucket(g) for g in gs]
    codecs = [make_codec(codec, len(gs), r) for r in range(len(gs))]
    outs = drive([b.phases(c) for b, c in zip(buckets, codecs)])
    return [b.result(out) for b, out in zip(buckets, outs)]


def gloo_sum(gs: list[torch.Tensor]) -> torch.Tensor:
    """What gloo's sparse all_reduce returns (checked against gloo in
    test_sparse_adam_state_equals_gloo): every rank's rows, coalesced, zero sums kept."""
    idx = torch.cat([g._indices() for g in gs], 1)
    vals = torch.cat([g._values() for g in gs])
    return torch.sparse_coo_tensor(idx, vals, gs[0].shape).coalesce()


def rows(t: torch.Tensor) -> list[int]:
    return t.coalesce().indices()[0].tolist()


@pytest.mark.parametrize("codec", ["lossless", "fixed_point"])
def test_rows_that_sum_to_zero_are_kept_as_gloo_keeps_them(codec):
    # row 3 cancels, row 7 is an explicit zero row, row 5 repeats within rank 1 and cancels
    gs = [
        torch.sparse_coo_tensor([[3, 1, 7]], torch.tensor([[1.0, 2], [5, 5], [0, 0]]), (10, 2)),
        torch.sparse_coo_tensor([[3, 5, 5]], torch.tensor([[-1.0, -2], [1, 1], [-1, -1]]), (10, 2)),
    ]
    want = gloo_sum(gs)
    assert rows(want) == [1, 3, 5, 7]
    for out in through(codec, gs):
        assert out.is_coalesced() and rows(out) == rows(want)
        torch.testing.assert_close(out.to_dense(), want.to_dense())


def test_the_union_rides_on_the_codecs_or_phase_or_gets_its_own():
    """The lossless codec sums rows: its index phase is the rows' bitmap (one bit per row,
    no element bitmap, no second copy); after another codec the rows' bitmap gets an OR
    phase of its own."""
    g = torch.sparse_coo_tensor([[2, 9]], torch.ones(2, 4), (40, 4))
    b = SparseBucket(g)
    by_rows = _phases(b.phases(make_codec("lossless", 1, 0)))
    assert [p.op for p in by_rows] == [Op.OR, Op.ADD]  # the exponents ride the OR phase
    assert by_rows[0].cells.size == EXP_BIT_WORDS + bitmap.bitmap_words(40) + 1
    assert b.by_rows and b.union is not None and b.union.tolist() == [2, 9]
    plain = _phases(make_codec("fixed_point", 1, 0).aggregate(to_codec_input(g)))
    b = SparseBucket(g)
    flat = _phases(b.phases(make_codec("fixed_point", 1, 0)))
    assert len(flat) == len(plain) + 1 and flat[-1].op == Op.OR
    assert not b.by_rows and b.union is not None and b.union.tolist() == [2, 9]


def _phases(gen) -> list:
    """The phases a codec generator yields with one worker."""
    seen: list = []

    def record(g):
        try:
            phase = next(g)
            while True:
                seen.append(phase)
                phase = g.send(phase.cells.copy())
        except StopIteration as done:
            return done.value

    record(gen)
    return seen


def test_through_a_codec_the_sum_is_exact() -> None:
    gs = [
        torch.sparse_coo_tensor([[r, 9]], torch.full((2, 3), float(r + 1)), (10, 3))
        for r in range(2)
    ]
    summed = through("lossless", gs)[0]
    torch.testing.assert_close(summed.to_dense(), (gs[0] + gs[1]).to_dense())
    assert rows(summed) == [0, 1, 9]


@pytest.mark.slow
def test_sparse_adam_state_equals_gloo(tmp_path):
    """Two gloo ranks: SparseAdam behind the switch hook (lossless, over a switch simulated
    by gloo collectives) ends with DDP-over-gloo's parameters and moments, the rows whose
    sum is zero included (gloo returns them: checked here too)."""
    worker = Path(__file__).with_name("sparse_adam_worker.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    out = tmp_path / "out.pt"
    cmds = [
        [sys.executable, str(worker), str(r), str(tmp_path / "store"), str(out)] for r in (0, 1)
    ]
    done = run_together(cmds, 120, env=env)
    assert all(code == 0 for code, _ in done), "\n".join(text[-3000:] for _, text in done)
    got = torch.load(out)
    summed = got["gloo_sum"]
    assert rows(summed) == [2, 3, 5, 6]  # row 2 (zeros) and row 3 (cancelled) are kept
    assert not summed.to_dense()[[2, 3]].any()
    for key, want in got["gloo"].items():
        torch.testing.assert_close(got["switch"][key], want, atol=1e-6, rtol=1e-5, msg=key)


def test_a_big_table_costs_its_rows_not_its_size():
    """Two ranks, a 1,000,000 x 16 table (64 MB as float32), a few rows each: through the
    lossless codec (by rows) no step allocates anything near the table's size; the flat
    path's sum and its scan would (the table's float32 per rank)."""
    import tracemalloc

    nrows, width = 1_000_000, 16
    gs = [
        torch.sparse_coo_tensor([[5, 999_999, 5]], torch.ones(3, width), (nrows, width)),
        torch.sparse_coo_tensor([[5, 123_456]], -torch.ones(2, width), (nrows, width)),
    ]
    tracemalloc.start()
    try:
        outs = through("lossless", gs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < nrows * width * 4 // 16, f"{peak / 1e6:.1f} MB at the peak"
    for out in outs:
        assert rows(out) == [5, 123_456, 999_999]
        torch.testing.assert_close(out.coalesce().values()[0], torch.ones(width))
