"""Homomorphic gradient codecs: generators of switch phases (ADD, OR, MAX over int32
cells) whose combined results decode into the sum of the workers' gradients.

The registry (CODECS, make_codec, register_codec) lives here, beside the codecs and away
from torch, so command lines can list codec names without importing torch (as PyTorch keeps
its DDP hook registry in its package's __init__)."""

from collections.abc import Callable
from typing import Any

from .base import (
    Codec,
    CodecError,
    CorruptResultError,
    GradInput,
    LossyCodec,
    NonFiniteError,
    PeelingError,
    Phase,
    SparseGrad,
)
from .cltk import CLTK
from .error_feedback import ErrorFeedback
from .fixed_point import FixedPoint
from .lossless import LosslessSparse
from .lowbit import LowBit
from .simulate import PhaseMismatch, combine, drive, simulate

CodecFactory = Callable[..., Codec]
"""Makes one codec object: factory(world, rank, **options)."""


def _lowbit(world: int, bits: int, gamma: float = 0.9, **options: Any) -> Codec:
    """Low-bit lanes with error feedback (CO3: gamma 0.9 by default; 0 turns it off)."""
    return ErrorFeedback(LowBit(world, bits=bits, **options), gamma=gamma)


CODECS: dict[str, CodecFactory] = {
    "lossless": lambda world, rank, **o: LosslessSparse(world, **o),
    "fixed_point": lambda world, rank, **o: FixedPoint(world, **o),
    "cltk": lambda world, rank, **o: CLTK(world, rank, **o),
    "ef_fixed_point": lambda world, rank, **o: ErrorFeedback(FixedPoint(world, **o)),
    "lowbit16": lambda world, rank, **o: _lowbit(world, 16, **o),
    "lowbit8": lambda world, rank, **o: _lowbit(world, 8, **o),
}
"""The codec registry: name -> factory, in registration order (the first is the default).
Iterate it for the names; add to it with register_codec."""

LANE_CODECS = ("lowbit16", "lowbit8")
"""The registry's codecs that add 16- or 8-bit lanes (ADD16, ADD8): they need a switch
whose program has them (the assignment's lane_ops)."""


def register_codec(name: str, factory: CodecFactory) -> None:
    """Add a codec under `name`; factory(world, rank, **options) returns a fresh codec."""
    if name in CODECS:
        raise ValueError(f"codec {name!r} is already registered")
    CODECS[name] = factory


def make_codec(name: str, world: int, rank: int, **options: Any) -> Codec:
    """A fresh codec object by name (one per bucket: codecs keep per-step state)."""
    factory = CODECS.get(name)
    if factory is None:
        raise ValueError(f"unknown codec {name!r}; expected one of {', '.join(CODECS)}")
    return factory(world, rank, **options)


__all__ = [
    "CLTK",
    "CODECS",
    "LANE_CODECS",
    "Codec",
    "CodecError",
    "CodecFactory",
    "CorruptResultError",
    "ErrorFeedback",
    "FixedPoint",
    "GradInput",
    "LosslessSparse",
    "LossyCodec",
    "LowBit",
    "NonFiniteError",
    "PeelingError",
    "Phase",
    "PhaseMismatch",
    "SparseGrad",
    "combine",
    "drive",
    "make_codec",
    "register_codec",
    "simulate",
]
