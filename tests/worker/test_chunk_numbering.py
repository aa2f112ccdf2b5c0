"""The chunk numbering (no switch needed): every slot copy is reused exactly every 2S
chunks, across the tag's wrap too, and the switch's serial-number order (RFC 1982) sees
each reuse as newer, for every pool size."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.wire.constants import CHUNK_MODULUS, NUM_SLOTS
from homagg.worker.transport.chunk_numbering import (
    chunk_period,
    chunk_tags,
    shadow_of,
    slot_of,
    tag_offset,
)

HALF = CHUNK_MODULUS // 2


def serial_newer(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """RFC 1982 order as the switch applies it: new is newer than old."""
    age = (new - old) % CHUNK_MODULUS
    return (age > 0) & (age < HALF)


def copy_of(tags: np.ndarray, pool_size: int) -> np.ndarray:
    """The slot copy (slot, shadow) as one number."""
    return slot_of(tags, pool_size) * 2 + shadow_of(tags, pool_size)


POOL_SIZES = [*range(1, 65), 100, 1000, 3000, 4095, NUM_SLOTS]


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_period_is_the_largest_multiple_of_two_pools_in_32_bits(pool_size):
    period = chunk_period(pool_size)
    assert period % (2 * pool_size) == 0
    assert CHUNK_MODULUS - 2 * pool_size < period <= CHUNK_MODULUS


def windows_distinct(a: np.ndarray, width: int) -> bool:
    """Whether every `width` consecutive elements of `a` are distinct: equal elements lie at
    least `width` apart (O(n log n), where a set per window is O(n width))."""
    order = np.lexsort((np.arange(len(a)), a))  # by value, then by position
    same = a[order][1:] == a[order][:-1]
    return bool((np.diff(order)[same] >= width).all())


def test_windows_distinct_is_a_set_per_window():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        width = int(rng.integers(1, 8))
        a = rng.integers(0, int(rng.integers(1, 12)), 2 * width - 1)
        windows = all(len(set(a[k : k + width].tolist())) == width for k in range(width))
        assert windows_distinct(a, width) == windows, (a, width)


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_slot_copies_are_reused_every_two_pools_across_the_wrap(pool_size):
    period = chunk_period(pool_size)
    first = period - 3 * pool_size + 1  # three pools before the wrap, three after
    tags = chunk_tags(first, 6 * pool_size, pool_size)
    assert tags.max() < period and tags.min() >= 0
    assert 0 in tags and period - 1 in tags
    copies = copy_of(tags, pool_size)
    two = 2 * pool_size
    np.testing.assert_array_equal(copies[two:], copies[:-two])  # the same copy 2S later
    # and no copy in between: every 2S consecutive copies of the first 4S - 1 are distinct
    assert windows_distinct(copies[: 2 * two - 1], two)
    assert serial_newer(tags[two:], tags[:-two]).all()
    assert not serial_newer(tags[:-two], tags[two:]).any()  # a late old one is STALE
    assert (slot_of(tags, pool_size) < pool_size).all()


@pytest.mark.parametrize("pool_size", [1, 3, 6, 100])
def test_stream_index_beyond_32_bits_and_offsets(pool_size):
    period = chunk_period(pool_size)
    first = 5 * period + period - 2
    tags = chunk_tags(first, 4, pool_size)
    np.testing.assert_array_equal(tags, [period - 2, period - 1, 0, 1])
    assert [tag_offset(int(t), int(tags[0]), pool_size) for t in tags] == [0, 1, 2, 3]
    assert tag_offset(int(tags[0]), int(tags[1]), pool_size) == period - 1  # an earlier one


@pytest.mark.parametrize("pool_size", [0, -1, NUM_SLOTS + 1])
def test_pool_sizes_the_switch_cannot_have_are_refused(pool_size):
    with pytest.raises(ValueError, match="pool_size must be"):
        chunk_period(pool_size)


def test_plain_32_bit_masking_would_break_the_pool_rule():
    """Why the period exists: with pool 100, tag & 0xFFFFFFFF reuses a copy 96 chunks later."""
    pool_size = 100
    ks = np.arange(CHUNK_MODULUS - 2 * pool_size, CHUNK_MODULUS + 2 * pool_size, dtype=np.int64)
    masked = ks % CHUNK_MODULUS
    copies = copy_of(masked, pool_size)
    assert (copies[2 * pool_size :] != copies[: -2 * pool_size]).any()
    numbered = copy_of(chunk_tags(int(ks[0]), ks.size, pool_size), pool_size)
    np.testing.assert_array_equal(numbered[2 * pool_size :], numbered[: -2 * pool_size])
