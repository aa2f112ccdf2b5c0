"""The slot allocator: first fit, coalescing on release, exact reservations, no overlaps."""

from __future__ import annotations

import itertools
import random

import pytest

from homagg.api.errors import ResourceExhausted
from homagg.control.pools import PoolExhausted, SlotAllocator


def test_first_fit_takes_the_lowest_hole_that_fits():
    a = SlotAllocator(100)
    assert [a.allocate(n) for n in (10, 20, 30)] == [0, 10, 30]
    a.release(10)  # hole 10..29
    assert a.allocate(25) == 60  # does not fit the hole
    assert a.allocate(5) == 10  # first fit, not best fit
    assert a.free_ranges() == [(15, 15), (85, 15)]


def test_release_coalesces_with_both_neighbours():
    a = SlotAllocator(100)
    bases = [a.allocate(20) for _ in range(5)]
    a.release(bases[1])
    a.release(bases[3])
    assert a.free_ranges() == [(20, 20), (60, 20)]
    a.release(bases[2])
    assert a.free_ranges() == [(20, 60)]
    assert a.allocate(60) == 20
    a.release(20)
    a.release(0)
    a.release(80)
    assert a.free_ranges() == [(0, 100)] and a.used_ranges() == []


def test_exhaustion_is_an_explicit_error():
    a = SlotAllocator(64)
    a.allocate(30)
    a.allocate(30)
    with pytest.raises(PoolExhausted, match="largest free range: 4") as info:
        a.allocate(5)
    assert isinstance(info.value, ResourceExhausted)
    assert a.slots_free() == 4 and a.largest_free() == 4


def test_sizes_and_releases_are_checked():
    a = SlotAllocator(16)
    for bad in (0, 17):
        with pytest.raises(ValueError):
            a.allocate(bad)
    with pytest.raises(KeyError):
        a.release(3)


def test_reserve_restores_exact_ranges():
    a = SlotAllocator(100)
    a.reserve(40, 10)
    a.reserve(0, 5)
    assert a.free_ranges() == [(5, 35), (50, 50)]
    with pytest.raises(ValueError, match="not all free"):
        a.reserve(45, 10)
    with pytest.raises(ValueError):
        a.reserve(95, 10)
    assert a.allocate(35) == 5 and a.allocate(1) == 50


def test_random_workload_never_overlaps():
    rng = random.Random(7)
    a = SlotAllocator(4096)
    live: dict[int, int] = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            base = rng.choice(list(live))
            assert a.release(base) == live.pop(base)
        else:
            size = rng.randint(1, 300)
            try:
                base = a.allocate(size)
            except PoolExhausted:
                assert a.largest_free() < size
                continue
            live[base] = size
        used = sorted(live.items())
        assert a.used_ranges() == used
        assert all(b1 + s1 <= b2 for (b1, s1), (b2, _) in itertools.pairwise(used))
        free = a.free_ranges()
        assert all(
            f1 + s1 < f2 for (f1, s1), (f2, _) in itertools.pairwise(free)
        )  # coalesced: never adjacent
        assert a.slots_free() + sum(live.values()) == 4096
