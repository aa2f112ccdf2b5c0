"""ScaleCom's cyclic local top-k (CLT-k): the step's leader picks the top-k of its
memory + gradient, every worker sends its own values at those indices, so the switch's
plain sum is the sum of the selected entries. Lossy by design; low-pass error memory."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from homagg.wire.constants import Op

from .base import CorruptResultError, GradInput, Phase, output_shape, to_dense
from .exponent import (
    DEFAULT_BLOCK,
    check_agreed,
    decode_shifts,
    dense_exponents,
    dequantize,
    headroom_bits,
    quantize,
    raise_on_status,
    status_cell,
)


def top_k_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Sorted indices of the k largest |values| (argpartition: O(n), no full sort)."""
    n = values.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.argpartition(np.abs(values), n - k)[n - k :]).astype(np.int64)


class CLTK:
    """CLT-k for one tensor on worker `rank` of `world_size`; k = round(ratio * n) agreed by all.

    Phases: MAX of [the leader's k sorted indices (others send -1)] + [block exponents of
    memory + gradient]; ADD of the k quantized values at those indices and a status cell."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        *,
        ratio: float = 0.01,
        beta: float = 0.1,
        block: int = DEFAULT_BLOCK,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a world of {world_size}")
        if not 0 < ratio <= 1 or not 0 <= beta <= 1:
            raise ValueError("ratio must be in (0, 1] and beta in [0, 1]")
        self.world_size, self.rank = world_size, rank
        self.ratio, self.beta, self.block = ratio, beta, block
        self.p = headroom_bits(world_size)
        self.step = 0
        self.memory: np.ndarray | None = None

    def k_for(self, n: int) -> int:
        """Number of selected entries for a tensor of n elements: round(ratio * n), at least 1."""
        return min(n, max(1, round(self.ratio * n)))

    def leader(self, step: int) -> int:
        """The rank that selects the indices at `step` (ScaleCom: step mod W)."""
        return step % self.world_size

    def aggregate(self, x: GradInput) -> Generator[Phase, np.ndarray, np.ndarray]:
        """Sum over workers at the leader's top-k of (memory + gradient); then the memory
        update m = (1 - beta) m + beta (p - c), p = m + g, c = what this worker sent."""
        shape = output_shape(x)
        g = to_dense(x)
        if self.memory is None or self.memory.size != g.size:
            self.memory = np.zeros(g.size, dtype=np.float32)
        p = self.memory + g
        total, idx, sent = yield from self._exchange(p)
        m = self.memory
        m *= np.float32(1.0 - self.beta)
        m += np.float32(self.beta) * p
        m[idx] -= np.float32(self.beta) * sent
        return total.reshape(shape)

    def compress(self, x: GradInput) -> Generator[Phase, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """One memoryless exchange of x (for an outer ErrorFeedback); return (decoded sum,
        this worker's contribution: its quantized values at the leader's indices)."""
        shape = output_shape(x)
        total, idx, sent = yield from self._exchange(to_dense(x))
        mine = np.zeros(total.size, dtype=np.float32)
        mine[idx] = sent
        return total.reshape(shape), mine.reshape(shape)

    def _exchange(self, p: np.ndarray):
        n = p.size
        step, self.step = self.step, self.step + 1  # advances even if the step fails
        if n == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32)
        k = self.k_for(n)
        own = dense_exponents(p, self.block)
        if self.rank == self.leader(step):
            chosen = top_k_indices(p, k).astype(np.int32)
        else:
            chosen = np.full(k, -1, dtype=np.int32)
        result = yield Phase(Op.MAX, np.concatenate([chosen, own]))
        if result.size != k + own.size:
            raise CorruptResultError(f"{result.size} cells received, {k + own.size} sent")
        idx = result[:k].astype(np.int64)
        if idx[0] < 0 or idx[-1] >= n or np.any(idx[1:] <= idx[:-1]):
            raise CorruptResultError("the leader's indices are not sorted indices of the tensor")
        exps = result[k:]
        ok = check_agreed(exps, own)
        blocks = idx // self.block
        q = quantize(np.take(p, idx), np.take(self.p - exps, blocks), self.p)
        if not ok:
            q[:] = 0
        summed = yield Phase(Op.ADD, np.concatenate([q, status_cell(ok)]))
        if summed.size != k + 1:
            raise CorruptResultError(f"{summed.size} cells received, {k + 1} sent")
        raise_on_status(summed[-1])
        shifts = np.take(decode_shifts(exps, self.p), blocks)
        total = np.zeros(n, dtype=np.float32)
        total[idx] = dequantize(summed[:-1], shifts)
        return total, idx, dequantize(q, shifts)
