"""Homomorphic gradient codecs: generators of switch phases (ADD, OR, MAX over int32
cells) whose combined results decode into the sum of the workers' gradients.

The registry (CODECS with each codec's exactness and lanes, DEFAULT_CODEC, CODEC_CHOICES,
check_codec, make_codec, register_codec) lives here, beside the codecs and away from
torch, so command lines can list codec names without importing torch (as PyTorch keeps
its DDP hook registry in its package's __init__)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    RowCodec,
    SparseGrad,
    SparseRows,
)
from .cltk import CLTK
from .error_feedback import ErrorFeedback
from .fixed_point import FixedPoint
from .lossless import LosslessSparse
from .lowbit import LowBit
from .simulate import PhaseMismatch, combine, drive, simulate

CodecFactory = Callable[..., Codec]
"""Makes one codec object: factory(world_size, rank, **options)."""


@dataclass(frozen=True)
class CodecEntry:
    """A registered codec: its factory, whether it is exact (its decoded sum is the true
    sum within the fixed-point bound of docs/codecs.md; a lossy codec's is not), and
    whether it adds 16- or 8-bit lanes (ADD16, ADD8: it needs a switch whose program has
    them, the assignment's lane_ops)."""

    factory: CodecFactory
    exact: bool = False
    lanes: bool = False


def _lowbit(world_size: int, bits: int, gamma: float = 0.9, **options: Any) -> Codec:
    """Low-bit lanes with error feedback (CO3: gamma 0.9 by default; 0 turns it off)."""
    return ErrorFeedback(LowBit(world_size, bits=bits, **options), gamma=gamma)


CODECS: dict[str, CodecEntry] = {
    "lossless": CodecEntry(
        lambda world_size, rank, **o: LosslessSparse(world_size, **o), exact=True
    ),
    "fixed_point": CodecEntry(
        lambda world_size, rank, **o: FixedPoint(world_size, **o), exact=True
    ),
    "cltk": CodecEntry(lambda world_size, rank, **o: CLTK(world_size, rank, **o)),
    "ef_fixed_point": CodecEntry(
        lambda world_size, rank, **o: ErrorFeedback(FixedPoint(world_size, **o))
    ),
    "lowbit16": CodecEntry(lambda world_size, rank, **o: _lowbit(world_size, 16, **o), lanes=True),
    "lowbit8": CodecEntry(lambda world_size, rank, **o: _lowbit(world_size, 8, **o), lanes=True),
}
"""The codec registry: name -> entry, in registration order. Iterate it for the names; add
to it with register_codec."""

DEFAULT_CODEC = "lossless"
"""The codec of a job, a hook or a command line that names none."""

AUTO_CODEC = "auto"
"""Not a codec: the DDP hook's delay-aware choice among CODECS per bucket and step
(homagg/worker/auto/control.py), which homagg.attach and command lines take beside the names."""

CODEC_CHOICES = (*CODECS, AUTO_CODEC)
"""What homagg.attach's codec= and homagg-run's --codec take: the codecs registered at
import, and AUTO_CODEC."""


def register_codec(
    name: str, factory: CodecFactory, *, exact: bool = False, lanes: bool = False
) -> None:
    """Add a codec under `name`; factory(world_size, rank, **options) returns a fresh codec;
    `exact`: its decoded sum is the true sum within the fixed-point bound; `lanes`: it
    sends ADD16 / ADD8 phases."""
    if name in CODECS:
        raise ValueError(f"codec {name!r} is already registered")
    CODECS[name] = CodecEntry(factory, exact, lanes)


def check_codec(name: str, *, also: Sequence[str] = ()) -> str:
    """`name` if it is a registered codec (or one of `also`, e.g. AUTO_CODEC); else
    a ValueError that names the choices."""
    if name not in CODECS and name not in also:
        raise ValueError(f"unknown codec {name!r}; expected one of {', '.join([*CODECS, *also])}")
    return name


def is_exact(name: str) -> bool:
    """Whether the registered codec `name` is exact (False for any other name)."""
    entry = CODECS.get(name)
    return entry is not None and entry.exact


def exact_codecs() -> tuple[str, ...]:
    """The names of the exact codecs, in registration order."""
    return tuple(name for name, entry in CODECS.items() if entry.exact)


def uses_lanes(name: str) -> bool:
    """Whether the registered codec `name` adds 16- or 8-bit lanes (False for any other
    name, e.g. "auto")."""
    entry = CODECS.get(name)
    return entry is not None and entry.lanes


def lane_codecs() -> tuple[str, ...]:
    """The names of the codecs that add 16- or 8-bit lanes, in registration order."""
    return tuple(name for name, entry in CODECS.items() if entry.lanes)


def make_codec(name: str, world_size: int, rank: int, **options: Any) -> Codec:
    """A fresh codec object by name (one per bucket: codecs keep per-step state)."""
    return CODECS[check_codec(name)].factory(world_size, rank, **options)


__all__ = [
    "AUTO_CODEC",
    "CLTK",
    "CODECS",
    "CODEC_CHOICES",
    "DEFAULT_CODEC",
    "Codec",
    "CodecEntry",
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
    "RowCodec",
    "SparseGrad",
    "SparseRows",
    "check_codec",
    "combine",
    "drive",
    "exact_codecs",
    "is_exact",
    "lane_codecs",
    "make_codec",
    "register_codec",
    "simulate",
    "uses_lanes",
]
