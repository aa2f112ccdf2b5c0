"""How the switch combines a slot's cells with a contribution's, per op (docs/protocol.md):
ADD wraps modulo 2^32 as int32, ADD16 / ADD8 wrap each lane on its own (homagg.wire.lanes),
OR is bitwise, MAX compares as signed int32. The one table of the reference switch and of
the codecs' simulated switch."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from homagg.wire.constants import CELL_BITS, LANE_BITS_OF_OP, Op
from homagg.wire.lanes import lanes_add

Combine = Callable[[np.ndarray, np.ndarray], np.ndarray]

# numpy's int32 array addition wraps in two's complement, exactly like the data plane.
COMBINE_OF_OP: dict[Op, Combine] = {
    **{
        op: np.add if bits == CELL_BITS else partial(lanes_add, bits=bits)
        for op, bits in LANE_BITS_OF_OP.items()
    },
    Op.OR: np.bitwise_or,
    Op.MAX: np.maximum,
}


def combine_cells(op: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cells the switch holds after combining int32 cells `b` into `a` under `op` (a
    new array; a ValueError for an op the switch does not have)."""
    return COMBINE_OF_OP[Op(op)](a, b)
