"""The vectors of the hook's decision protocol, by name (docs/worker.md: the collective
fallback decision), and how the gloo agreement's vector decides.

Within a step, a bucket's outcome is agreed through the switch itself: one MAX packet
after the bucket's phases (`SwitchVerdict`), sent only by a rank whose phases succeeded, so
that its result exists only when every rank's did. The step's last agreement, and every
one after a failure, goes through the process group (`GlooVerdict`, MAX): it seals the
step, so that a rank that missed the switch's answer (the switch died between its copies)
and a rank that got it meet again there at the latest. Ranks differ by at most one
agreement when they meet (a switch verdict completes only once every rank has sent it), and
`resolve` reads from the agreed vector who was behind: such a rank keeps its bucket (every
rank's phases had succeeded), every rank falls back from the next bucket on.

codec="auto"'s per-step decision vector rides the switch the same way (`SwitchDecision`: one
MAX packet of its cells, counted as an agreement). It is unsealed until the next agreement
over the process group, which carries `missed`: when any rank missed the switch's answer,
every rank all_reduces (MAX) the cells it had sent, and gets the answer the switch gave the
others (the same integers' MAX)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from homagg.wire.constants import Op
from homagg.worker.codecs.base import Phase

Phases = Generator[Phase, np.ndarray, np.ndarray]

# Failure kinds, exchanged as MAX over ranks: the highest one names the agreed reason.
OK, UNHEALTHY, CODEC_FAILED, SWITCH_TIMEOUT, ERROR = 0, 1, 2, 3, 4


class SwitchVerdict(NamedTuple):
    """The cells of the verdict packet (op MAX): each rank's health kind after its bucket;
    agreed, the worst one. Sent only by a rank whose phases succeeded."""

    health: int

    def cells(self) -> np.ndarray:
        """The int32 cells the packet carries, in field order."""
        return np.array(list(self), dtype=np.int32)

    @classmethod
    def from_cells(cls, cells: np.ndarray) -> SwitchVerdict:
        """The agreed verdict read back from the switch's result; a result of another
        length is a corrupt answer (ValueError)."""
        if cells.size != len(cls._fields):
            raise ValueError(f"a verdict of {cells.size} cells, expected {len(cls._fields)}")
        return cls(*(int(v) for v in cells))


@dataclass
class SwitchRound:
    """One round's phases (a bucket's, or several buckets' coalesced) followed by its verdict
    packet, in one transport run: what the rank learnt (`summed`: what its phases returned,
    once they succeeded; `verdict`: the switch answered it)."""

    summed: Any = None
    verdict: SwitchVerdict | None = None

    def phases(
        self, inner: Generator[Phase, np.ndarray, Any], health: Callable[[], int]
    ) -> Generator[Phase, np.ndarray, Any]:
        """`inner`'s phases, then the verdict (this rank's health once they succeeded)."""
        out = yield from inner
        self.summed = out
        agreed = yield Phase(Op.MAX, SwitchVerdict(health()).cells())
        self.verdict = SwitchVerdict.from_cells(np.asarray(agreed))
        return out


class GlooVerdict(NamedTuple):
    """The process group's agreement vector, by name (MAX over ranks of each field):
    `done` agreements this rank decided and its negation (agreed: the most and the fewest),
    the failure kind of its bucket's phases (OK: they succeeded, or no bucket), the kind of
    what broke its switch stream (a verdict not answered; or OK), its health kind, its next
    chunk (the counter every rank resumes at), its step (a cool-down counts from the
    latest) and whether it missed the switch's answer to an unsealed decision (1: every
    rank repairs it, `SwitchDecision.repair`)."""

    done: int
    neg_done: int
    failure: int
    stream: int
    health: int
    chunk: int
    step: int
    missed: int

    @classmethod
    def local(
        cls,
        done: int,
        failure: int,
        stream: int,
        health: int,
        chunk: int,
        step: int,
        missed: int = 0,
    ) -> GlooVerdict:
        """This rank's vector."""
        return cls(done, -done, failure, stream, health, chunk, step, missed)

    def pack(self) -> torch.Tensor:
        """The vector the MAX over the ranks takes (int64, in field order)."""
        return torch.tensor(list(self), dtype=torch.int64)

    @classmethod
    def from_agreed(cls, t: torch.Tensor) -> GlooVerdict:
        """The agreed vector read back from the reduced tensor."""
        return cls(*(int(v) for v in t.tolist()))


@dataclass
class SwitchDecision:
    """A vector agreed by one MAX packet through the switch (codec="auto"'s decision): the
    cells this rank sent and, when the switch answered, the agreed ones (None: missed)."""

    cells: np.ndarray
    agreed: np.ndarray | None = None

    def phases(self) -> Phases:
        """The one MAX phase; its answer is kept in `agreed`."""
        got = yield Phase(Op.MAX, self.cells)
        self.agreed = np.asarray(got, np.int32).copy()
        return self.agreed

    @property
    def missed(self) -> bool:
        """Whether the switch's answer never came (or was never asked for)."""
        return self.agreed is None

    def repair(self, reduce_max: Callable[[torch.Tensor], None]) -> None:
        """Agree the same cells over the process group (every rank, when any missed the
        answer): the switch's MAX of every rank's cells, on every rank."""
        t = torch.from_numpy(self.cells.astype(np.int64))
        reduce_max(t)
        self.agreed = t.numpy().astype(np.int32)


@dataclass(frozen=True)
class Resolution:
    """What an agreed `GlooVerdict` means for one rank: whether its bucket's switch result
    is the agreed one (`keep`), the kind to fall back for (OK: stay on the switch), the
    chunk and step to resume from, and the agreements decided once it is applied."""

    keep: bool
    kind: int
    chunk: int
    step: int
    done: int


def resolve(agreed: GlooVerdict, done: int) -> Resolution:
    """The agreed vector read by a rank that had decided `done` agreements. A rank behind
    the others missed the switch's answer to a verdict every rank sent, so its phases, like
    everyone's, succeeded: it keeps its result. A rank ahead decided that verdict and, with
    a bucket in flight, fails it (the others never sent its phases). Any spread means a
    switch stream broke: everyone falls back."""
    fewest = -agreed.neg_done
    spread = agreed.done > fewest
    kind = max(agreed.failure, agreed.stream, agreed.health)
    if spread:
        kind = kind or SWITCH_TIMEOUT
    keep = done == fewest if spread else agreed.failure == OK
    return Resolution(keep, kind, agreed.chunk, agreed.step, agreed.done + 1)
