"""Homomorphic gradient codecs: generators of switch phases (ADD, OR, MAX over int32
cells) whose combined results decode into the sum of the workers' gradients."""

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

__all__ = [
    "CLTK",
    "Codec",
    "CodecError",
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
    "simulate",
]
