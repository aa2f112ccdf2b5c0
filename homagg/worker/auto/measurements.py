"""codec="auto"'s measured step: what each bucket ran (`Taken`) and its numbers by name
(`Measurements`), with their one vector layout for the MAX over the ranks that agrees them:
[-cost_i..., -budget_i..., nonzero_i..., wire_i..., iteration]. Costs and budgets travel
negated, so the MAX over ranks is their MIN. On the wire (`to_cells`) the vector is int32
cells in millionths (microseconds, or parts per million of a share), the switch's MAX and
gloo's alike: both ways agree the same integers, so the same decisions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from homagg.worker.auto.control import Choice

# The cells' unit: a microsecond, or a millionth of a share or a density.
CELL_SCALE = 1e6
_CELL_LIMIT = np.iinfo(np.int32).max  # |a cell| at most this (2,147 s; a share of 2,147)

# (field, sign on the wire), in the vector's order; the iteration time comes last.
_PER_BUCKET = (("costs", -1.0), ("budgets", -1.0), ("nonzero", 1.0), ("wires", 1.0))


@dataclass(frozen=True)
class Measurements:
    """One step's numbers for buckets in a given order: each bucket's path cost (seconds),
    budget (seconds), nonzero share and wire density, and the step before's iteration time.
    Agreed, they are the smallest cost and budget, the largest share and density and the
    longest iteration over ranks."""

    costs: np.ndarray
    budgets: np.ndarray
    nonzero: np.ndarray
    wires: np.ndarray
    iteration: float

    def pack(self) -> np.ndarray:
        """The float64 vector the MAX over the ranks takes."""
        parts = [sign * np.asarray(getattr(self, name), np.float64) for name, sign in _PER_BUCKET]
        return np.concatenate([*parts, [self.iteration]]).astype(np.float64)

    @classmethod
    def from_agreed(cls, vector: np.ndarray, buckets: int) -> Measurements:
        """The numbers read back from a reduced vector of `buckets` buckets."""
        got = {
            name: sign * vector[k * buckets : (k + 1) * buckets]
            for k, (name, sign) in enumerate(_PER_BUCKET)
        }
        return cls(**got, iteration=float(vector[len(_PER_BUCKET) * buckets]))


def to_cells(vector: np.ndarray) -> np.ndarray:
    """A packed vector (`Measurements.pack`) as the int32 cells its MAX agreement takes,
    in millionths, clamped to int32 (a NaN measures nothing: 0)."""
    scaled = np.nan_to_num(np.asarray(vector, np.float64) * CELL_SCALE)
    return np.clip(np.rint(scaled), -_CELL_LIMIT, _CELL_LIMIT).astype(np.int32)


def from_cells(cells: np.ndarray) -> np.ndarray:
    """The packed vector read back from agreed cells (any integer dtype)."""
    return np.asarray(cells, np.float64) / CELL_SCALE


@dataclass(frozen=True)
class Taken:
    """What each bucket ran in a measured step and at which rule density, kept until the
    step's agreed numbers decide (a later step may run something else by then)."""

    ran: dict[int, tuple[Choice, float]]  # the buckets that ran (not the fallback)
    epoch: int  # the controller's epoch then: numbers from before a `release` teach nothing
