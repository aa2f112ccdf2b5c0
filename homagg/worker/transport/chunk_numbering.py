"""The job's chunk numbering: which chunk tag, slot and shadow copy chunk k of the stream uses.

Chunk tags on the wire are 32-bit serial numbers, but a pool of S slots with two copies
each is reused with period 2S, and 2S divides 2^32 only for powers of two. So the tag runs
modulo the numbering period P = 2S * floor(2^32 / 2S), the largest multiple of 2S that fits
in 32 bits, and the slot and copy derive from the tag: every slot copy is then used by
every 2S-th chunk, across the tag's wrap too (docs/protocol.md, "Chunk numbering").
"""

from __future__ import annotations

import numpy as np

from homagg.wire.constants import CHUNK_MODULUS, NUM_SLOTS


def chunk_period(pool_size: int) -> int:
    """P(S): the modulus of chunk tags for a pool of S slots (a multiple of 2S, > 2^32 - 2S)."""
    if not 1 <= pool_size <= NUM_SLOTS:
        raise ValueError(f"pool_size must be 1..{NUM_SLOTS}, not {pool_size}")
    copies = 2 * pool_size
    return CHUNK_MODULUS - CHUNK_MODULUS % copies


def chunk_tags(first: int, count: int, pool_size: int) -> np.ndarray:
    """The wire tags of chunks first .. first+count-1 of the stream (int64, 0 <= tag < P)."""
    period = chunk_period(pool_size)
    return (first % period + np.arange(count, dtype=np.int64)) % period


def slot_of(tags: np.ndarray, pool_size: int) -> np.ndarray:
    """The slot of the pool each tag uses."""
    return tags % pool_size


def shadow_of(tags: np.ndarray, pool_size: int) -> np.ndarray:
    """The copy (0 or 1) of its slot each tag uses."""
    return (tags // pool_size) % 2


def tag_offset(tag: int, first_tag: int, pool_size: int) -> int:
    """How many chunks after `first_tag` the chunk tagged `tag` comes (modulo the period)."""
    return (tag - first_tag) % chunk_period(pool_size)
