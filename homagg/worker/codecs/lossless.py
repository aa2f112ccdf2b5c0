"""Lossless homomorphic sparse codec (after Li et al., ICML 2024): union support by an
OR'd bitmap, then values summed by the switch at their ranks in the union (default) or in
a count sketch decoded exactly by peeling.

Phases per step: OR of the block exponents (one bit each: the highest set is their MAX), the
support bitmap and a status word (a big bitmap in two levels: nonzero words, then those
words); ADD of the values plus a fingerprint. `exponents="max"` agrees the exponents in a
MAX phase of their own first (one round trip more, the same sums). The decoded sum equals
the dense fixed-point sum bit for bit (same exponents, same quantization). `aggregate_rows`
runs the same phases on an embedding's rows, with the rows as the support keys."""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np

from homagg.wire.constants import Op

from . import bitmap
from .base import (
    CorruptResultError,
    GradInput,
    PeelingError,
    Phase,
    SparseRows,
    output_shape,
    to_sparse,
)
from .count_sketch import (
    FINGERPRINT_CELLS,
    PeelPlan,
    SketchShape,
    decode,
    encode,
    fingerprint,
    plan_peeling,
)
from .exponent import (
    DEFAULT_BLOCK,
    check_agreed,
    decode_shifts,
    dequantize_at,
    exponents_as_bits,
    exponents_from_bits,
    headroom_bits,
    quantize_at,
    raise_on_status,
    sparse_exponents,
)

VALUE_MODES = ("sketch", "ranked")
EXPONENT_MODES = ("or", "max")  # in the (first) OR phase, or in a MAX phase before it
TWO_LEVEL_MIN_WORDS = 1024  # bitmaps this big (4 packets of 256 cells) go in two levels
_FAULT, _NONEMPTY = 1, 2  # bits of the OR phase's status word


def sketch_rows(
    keys: int,
    attempt: int,
    factor: float = 1.23,
    margin: float = 1.0,
    extra: int = 16,
    growth: float = 1.5,
) -> int:
    """Rows of attempt `attempt` for `keys` union keys: (factor * keys + margin * sqrt(keys)
    + extra) * growth^(attempt // 2), rounded up to a multiple of 3. The 3-hash peeling
    threshold is keys/rows ~0.818; sqrt(keys) covers its finite-size window, `extra` tiny
    unions. Odd attempts only change the seed: small stopping sets (a few keys sharing
    rows) vanish with another seed, at no cost in cells."""
    rows = (factor * keys + margin * math.sqrt(keys) + extra) * growth ** (attempt // 2)
    return 3 * max(1, math.ceil(rows / 3))


class LosslessSparse:
    """The lossless sparse codec for one tensor on one worker. `support_block` > 1 makes
    the support (and the sketch keys) blocks of that many consecutive elements, e.g. one
    embedding row; `values="ranked"` sends the values at their rank in the union instead
    of a sketch (|U| cells, no peeling). `index_levels` 1 or 2 forces the support
    bitmap's form (default: two levels from TWO_LEVEL_MIN_WORDS words). The returned sum
    is a read-only view of a buffer the codec reuses: the next `aggregate` on the same
    codec overwrites it (copy it to keep it); only the elements written last time are
    cleared, so a step costs O(|U|) and not the page faults of a fresh n-element array
    (one codec per bucket, as the DDP hook does). `aggregate_rows` (a sparse gradient's
    rows) uses neither the buffer nor support_block: its keys are the rows."""

    def __init__(
        self,
        world_size: int,
        *,
        support_block: int = 1,
        exp_block: int = DEFAULT_BLOCK,
        values: str = "ranked",
        factor: float = 1.23,
        margin: float = 1.0,
        extra: int = 16,
        growth: float = 1.5,
        max_attempts: int = 6,
        seed: int = 0,
        index_levels: int | None = None,
        exponents: str = "or",
    ):
        if exponents not in EXPONENT_MODES:
            raise ValueError(f"exponents must be one of {EXPONENT_MODES}, not {exponents!r}")
        if values not in VALUE_MODES:
            raise ValueError(f"values must be one of {VALUE_MODES}, not {values!r}")
        if support_block < 1 or exp_block < 1 or max_attempts < 1:
            raise ValueError("support_block, exp_block and max_attempts must be >= 1")
        if index_levels not in (None, 1, 2):
            raise ValueError(f"index_levels must be 1, 2 or None (by size), not {index_levels!r}")
        self.index_levels = index_levels
        self.exponents = exponents
        self.world_size = world_size
        self.support_block = support_block
        self.exp_block = exp_block
        self.values = values
        self.factor, self.margin, self.extra, self.growth = factor, margin, extra, growth
        self.max_attempts = max_attempts
        self.seed = seed
        self.p = headroom_bits(world_size)
        self.last_attempts = 0  # sketch attempts the last step needed (diagnostics)
        self._out = np.zeros(0, dtype=np.float32)
        self._written = np.zeros(0, dtype=np.int64)  # where _out may be nonzero

    def plan(self, union_keys: np.ndarray, block: int | None = None) -> PeelPlan:
        """The first sketch geometry (from shared data only) whose peeling succeeds; the
        same on every worker. `block`: elements per key (default support_block). Raises
        PeelingError after max_attempts."""
        for attempt in range(self.max_attempts):
            rows = sketch_rows(
                union_keys.size, attempt, self.factor, self.margin, self.extra, self.growth
            )
            shape = SketchShape(rows, block or self.support_block, self.seed + attempt)
            plan = plan_peeling(union_keys, shape)
            if plan is not None:
                self.last_attempts = attempt + 1
                return plan
        raise PeelingError(
            f"the count sketch of {union_keys.size} keys did not peel in "
            f"{self.max_attempts} attempts (factor {self.factor}, "
            f"growth {self.growth})"
        )

    def aggregate(self, x: GradInput) -> Generator[Phase, np.ndarray, np.ndarray]:
        """Sum over workers of x, lossless up to the agreed fixed-point quantization."""
        shape = output_shape(x)
        idx, vals, n = to_sparse(x)
        out = self._output(n)
        if n == 0:
            return out.reshape(shape)
        d = self.support_block
        keys = idx // d
        mine = keys if d == 1 or keys.size == 0 else keys[np.r_[True, keys[1:] != keys[:-1]]]
        _, elements, sums = yield from self._sum(idx, vals, n, d, mine)
        self._written = elements
        self._out[elements] = sums
        return out.reshape(shape)

    def aggregate_rows(self, x: SparseRows) -> Generator[Phase, np.ndarray, SparseRows]:
        """The sum over workers of an (nrows, width) table's rows, lossless as `aggregate`
        and equal to it with support_block = width, in time proportional to the rows: the
        keys are the rows themselves (the union is every worker's rows, zero rows too, as
        gloo's sparse all_reduce keeps them), the values go at their rank in the union (or
        in the sketch), and the sum comes back as rows, never as a table-sized vector."""
        rows, values, nrows = _check_rows(x)
        width = values.shape[1]
        if nrows * width == 0:
            return SparseRows(rows, values, nrows)
        flat = values.reshape(-1)
        nz = np.flatnonzero(flat != 0)
        idx = np.take(rows, nz // width) * width + nz % width
        union, _, sums = yield from self._sum(idx, np.take(flat, nz), nrows * width, width, rows)
        at = np.minimum(np.searchsorted(union, rows), max(union.size - 1, 0))
        if rows.size and not np.array_equal(np.take(union, at), rows):
            raise CorruptResultError("a row this worker sent is missing from the rows' union")
        return SparseRows(union, sums.reshape(union.size, width), nrows)

    def _sum(self, idx: np.ndarray, vals: np.ndarray, n: int, d: int, mine: np.ndarray):
        """The phases of one step over n elements, keys of d elements each, this worker's
        nonzeros (idx, vals) and keys `mine` (sorted, unique): returns the union of the
        keys, its elements below n and their decoded sums."""
        own = sparse_exponents(idx, vals, n, self.exp_block)
        nkeys = -(-n // d)
        # The status word rides along the (first) OR phase: a local fault stops every worker
        # there, and "someone has keys" (nonzeros, or rows) guards the one case no later
        # phase can check.
        status = _NONEMPTY if mine.size else 0
        words = bitmap.pack(mine, nkeys)
        if self.exponents == "max":
            exps = yield Phase(Op.MAX, own)
            status |= 0 if check_agreed(exps, own) else _FAULT
            union, status, _ = yield from self._union(words, nkeys, status)
            fault = False  # reported in the status word, raised by every worker above
        else:  # a fault seen after the OR phase goes in the value phase's fingerprint
            bits = exponents_as_bits(own)
            union, status, bits = yield from self._union(words, nkeys, status, bits)
            exps = exponents_from_bits(bits, own.size)
            fault = not check_agreed(exps, own)
        if union.size == 0:
            if mine.size or status & _NONEMPTY:
                raise CorruptResultError("the union support is empty but a worker has nonzeros")
            return union, union, np.zeros(0, dtype=np.float32)

        keys = idx // d
        q = quantize_at(vals, exps, idx // self.exp_block, self.p)
        elements = (union[:, None] * d + np.arange(d)).ravel() if d > 1 else union
        values = self._ranked if self.values == "ranked" else self._sketched
        witness = (own == exps).astype(np.int32) if self.exponents == "or" else own[:0]
        sums, seen = yield from values(
            union, keys, idx - keys * d, q, elements, idx, d, fault, witness, n
        )
        if np.any(seen < 1):  # the OR has no check of its own for a raised exponent
            raise CorruptResultError("an agreed exponent is no worker's: the OR is corrupt")
        if d > 1:
            beyond = elements >= n  # the last block may be partial
            if np.any(sums[beyond]):
                raise CorruptResultError("nonzero sum beyond the tensor's end")
            elements, sums = elements[~beyond], sums[~beyond]
        limit = self.world_size * (2**self.p - 1)
        if np.any(np.abs(sums.astype(np.int64)) > limit):
            raise CorruptResultError("a decoded sum exceeds what the workers can send")
        shifts = decode_shifts(exps, self.p)
        return union, elements, dequantize_at(sums, shifts, elements // self.exp_block)

    def _output(self, n: int) -> np.ndarray:
        """The reused output buffer of n zeros (cleared where the last step wrote)."""
        if self._out.size != n:
            self._out = np.zeros(n, dtype=np.float32)
        elif self._written.size:
            self._out[self._written] = 0
        self._written = np.zeros(0, dtype=np.int64)
        view = self._out.view()
        view.flags.writeable = False  # a caller's write would break the all-zero invariant
        return view

    def _union(self, words: np.ndarray, nkeys: int, status: int, prefix: np.ndarray | None = None):
        """The union support (sorted keys), the combined status word and the OR of the
        `prefix` cells sent ahead of the (first) OR phase's index. A big bitmap goes in two
        levels: first the OR of "word w is nonzero" (one bit per word), then only the words
        nonzero somewhere, for one more round trip; at 1% density and W = 4 that skips ~27%
        of the words, at 0.1% ~88%."""
        ahead = np.zeros(0, np.int32) if prefix is None else prefix
        levels = self.index_levels or (2 if words.size >= TWO_LEVEL_MIN_WORDS else 1)
        first = words if levels == 1 else bitmap.pack(np.flatnonzero(words), words.size)
        combined = yield Phase(Op.OR, np.r_[ahead, first, np.int32(status)])
        if combined.size != ahead.size + first.size + 1:
            raise CorruptResultError(f"{combined.size} index words received")
        status = int(combined[-1])
        raise_on_status(status & _FAULT)
        prefix_or, top = combined[: ahead.size], combined[ahead.size : -1]
        if levels == 1:
            return bitmap.unpack(top, nkeys), status, prefix_or
        chosen = bitmap.unpack(top, words.size)
        if chosen.size == 0:
            return chosen, status, prefix_or
        picked = yield Phase(Op.OR, np.take(words, chosen))
        if picked.size != chosen.size:
            raise CorruptResultError(f"{picked.size} index words received, {chosen.size} sent")
        if not np.all(picked):  # a word chosen because some worker had bits there came back empty
            raise CorruptResultError("an index word that some worker set came back empty")
        full = np.zeros(words.size, dtype=np.int32)
        full[chosen] = picked
        return bitmap.unpack(full, nkeys), status, prefix_or

    def _ranked(
        self,
        union: np.ndarray,
        keys: np.ndarray,
        cols: np.ndarray,
        q: np.ndarray,
        elements: np.ndarray,
        idx: np.ndarray,
        d: int,
        fault: bool,
        extra: np.ndarray,
        at: int,
    ):
        ranks = _ranks(union, keys, -(-at // d))
        # A nonzero missing from the union is left out here and caught by the fingerprint
        # on every worker, rather than raised on this one alone.
        there = np.take(union, ranks) == keys
        size = union.size * d
        cells = np.zeros(size + extra.size + FINGERPRINT_CELLS, dtype=np.int32)
        cells[size : size + extra.size] = extra
        if there.all():  # the usual case: every nonzero is in the union
            cells[ranks * d + cols] = q
        else:
            cells[np.compress(there, ranks * d + cols)] = np.compress(there, q)
        cells[-FINGERPRINT_CELLS:] = _marked(_fingerprint(idx, q, extra, at), fault)
        summed = yield Phase(Op.ADD, cells)
        if summed.size != cells.size:
            raise CorruptResultError(f"{summed.size} cells received, {cells.size} sent")
        sums, seen = summed[:size], summed[size:-FINGERPRINT_CELLS]
        if not np.array_equal(_fingerprint(elements, sums, seen, at), summed[-FINGERPRINT_CELLS:]):
            raise CorruptResultError(
                "decoded values do not match the fingerprint (or a worker's exponent exceeds "
                "the agreed one)"
            )
        return sums, seen

    def _sketched(
        self,
        union: np.ndarray,
        keys: np.ndarray,
        cols: np.ndarray,
        q: np.ndarray,
        elements: np.ndarray,
        idx: np.ndarray,
        d: int,
        fault: bool,
        extra: np.ndarray,
        at: int,
    ):
        plan = self.plan(union, d)
        cells = np.concatenate(
            [
                encode(keys, cols, q, plan.shape),
                extra,
                _marked(_fingerprint(idx, q, extra, at), fault),
            ]
        )
        summed = yield Phase(Op.ADD, cells)
        if summed.size != cells.size:
            raise CorruptResultError(f"{summed.size} cells received, {cells.size} sent")
        size = cells.size - extra.size - FINGERPRINT_CELLS
        sums, seen = decode(plan, summed[:size]).ravel(), summed[size:-FINGERPRINT_CELLS]
        if not np.array_equal(_fingerprint(elements, sums, seen, at), summed[-FINGERPRINT_CELLS:]):
            raise CorruptResultError("decoded values do not match the sketch's fingerprint")
        return sums, seen


DENSE_UNION = 8  # a union of at least 1/8 of the keys: ranks by a table of every key


def _ranks(union: np.ndarray, keys: np.ndarray, nkeys: int) -> np.ndarray:
    """Each key's rank in the sorted `union` of keys below `nkeys` where it is there (any
    index below union.size where it is not: the caller checks). A dense union's ranks come
    from a table over every key, O(nkeys); a sparse one's by binary search."""
    if union.size * DENSE_UNION < nkeys or keys.size < DENSE_UNION:
        return np.minimum(np.searchsorted(union, keys), union.size - 1)
    table = np.zeros(nkeys, np.int64)
    table[union] = np.arange(union.size)
    return np.take(table, keys)


def _fingerprint(elements: np.ndarray, q: np.ndarray, extra: np.ndarray, at: int) -> np.ndarray:
    """The fingerprint of the values and of the `extra` cells sent beside them (taken as
    the values of elements `at`, `at` + 1, ...: past the tensor's), so both are checked."""
    if not extra.size:
        return fingerprint(elements, q)
    past = at + np.arange(extra.size, dtype=np.int64)
    keys = np.concatenate([elements.astype(np.int64, copy=False), past])
    return fingerprint(keys, np.concatenate([q.astype(np.int32), extra.astype(np.int32)]))


def _marked(fp: np.ndarray, fault: bool) -> np.ndarray:
    """The fingerprint cells, off by one when this worker saw a fault of its own after the
    OR phase (its exponent above the agreed one): every worker's check then fails alike."""
    if not fault:
        return fp
    out = np.array(fp, dtype=np.int32)
    out.view(np.uint32)[0] += np.uint32(1)  # modulo 2^32, as the switch adds
    return out


def _check_rows(x: SparseRows) -> tuple[np.ndarray, np.ndarray, int]:
    """x's rows (int64), values (float32, 2-D) and row count, checked: one value row per
    row, the rows sorted, unique and inside the table (a ValueError otherwise)."""
    rows = np.asarray(x.rows, dtype=np.int64).reshape(-1)
    values = np.asarray(x.values, dtype=np.float32)
    nrows = int(x.nrows)
    if values.ndim != 2 or values.shape[0] != rows.size or values.shape[1] < 1:
        raise ValueError(f"sparse rows: {rows.size} rows but values of shape {values.shape}")
    if rows.size and (rows[0] < 0 or rows[-1] >= nrows or np.any(rows[1:] <= rows[:-1])):
        raise ValueError(f"sparse rows: the rows must be sorted, unique and in [0, {nrows})")
    return rows, values, nrows
