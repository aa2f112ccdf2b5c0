"""Each switch's aggregation slots, split among jobs: a pool is a contiguous range
[base, base + size); allocation is first fit, and a released range merges with its free
neighbours so that fragmentation never outlives the jobs that caused it."""

from __future__ import annotations

import bisect

from homagg.api.errors import ResourceExhausted
from homagg.wire.constants import NUM_SLOTS


class PoolExhausted(ResourceExhausted):
    """No free range is large enough; the message gives the largest one."""


class SlotAllocator:
    """First-fit allocator over slots 0..total-1; no two allocated ranges ever overlap."""

    def __init__(self, total: int = NUM_SLOTS) -> None:
        if total < 1:
            raise ValueError(f"a switch has at least one slot, not {total}")
        self.total = total
        self._free: list[tuple[int, int]] = [(0, total)]  # (base, size), sorted, never adjacent
        self._used: dict[int, int] = {}  # base -> size

    def allocate(self, size: int) -> int:
        """Take the first free range that holds `size` slots; returns its base."""
        if not 1 <= size <= self.total:
            raise ValueError(f"pool size {size} outside 1..{self.total}")
        for i, (base, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[i]
                else:
                    self._free[i] = (base + size, free - size)
                self._used[base] = size
                return base
        raise PoolExhausted(
            f"no {size} contiguous free slots (largest free range: "
            f"{self.largest_free()}, {self.slots_free()} of {self.total} free)"
        )

    def reserve(self, base: int, size: int) -> None:
        """Mark an exact range as allocated (rebuilding persisted pools); ValueError if any slot
        is taken."""
        if size < 1 or base < 0 or base + size > self.total:
            raise ValueError(f"range {base}+{size} outside the switch's {self.total} slots")
        i = bisect.bisect_right(self._free, (base, self.total + 1)) - 1
        if i < 0 or self._free[i][0] + self._free[i][1] < base + size:
            raise ValueError(f"slots {base}..{base + size - 1} are not all free")
        fbase, fsize = self._free[i]
        pieces = [(fbase, base - fbase), (base + size, fbase + fsize - base - size)]
        self._free[i : i + 1] = [p for p in pieces if p[1] > 0]
        self._used[base] = size

    def release(self, base: int) -> int:
        """Free the range allocated at `base` (merging it with free neighbours); returns its
        size."""
        size = self._used.pop(base, None)
        if size is None:
            raise KeyError(f"no pool allocated at slot {base}")
        i = bisect.bisect_left(self._free, (base, 0))
        start, end = base, base + size
        if i < len(self._free) and self._free[i][0] == end:
            end += self._free[i][1]
            del self._free[i]
        if i > 0 and sum(self._free[i - 1]) == start:
            start = self._free[i - 1][0]
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (start, end - start))
        return size

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free ranges (base, size) in slot order."""
        return list(self._free)

    def used_ranges(self) -> list[tuple[int, int]]:
        """The allocated ranges (base, size) in slot order."""
        return sorted(self._used.items())

    def largest_free(self) -> int:
        """Size of the largest free range (0 when the switch is full)."""
        return max((size for _, size in self._free), default=0)

    def slots_free(self) -> int:
        """Number of free slots."""
        return sum(size for _, size in self._free)
