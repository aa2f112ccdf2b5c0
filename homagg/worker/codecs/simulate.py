"""Drive W codec generators in lockstep with the switch's exact cell semantics, for tests
and benchmarks (the real transport drives the same generators through the switch)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from functools import reduce

import numpy as np

from homagg.wire.combine import COMBINE_OF_OP
from homagg.wire.constants import Op

from .base import Codec, GradInput, Phase


class PhaseMismatch(AssertionError):
    """Workers left lockstep: different ops, lengths or numbers of phases, or only some of
    them failed."""


def combine(op: Op, cells: Sequence[np.ndarray]) -> np.ndarray:
    """The switch's element-wise combination of every worker's cells (homagg.wire.combine)."""
    return reduce(COMBINE_OF_OP[Op(op)], cells[1:], cells[0].copy())


def _check_phases(phases: Sequence[Phase], step: int) -> None:
    for rank, phase in enumerate(phases):
        cells = phase.cells
        if not isinstance(cells, np.ndarray) or cells.dtype != np.int32 or cells.ndim != 1:
            raise PhaseMismatch(f"step {step}: worker {rank} sent cells that are not 1-D int32")
        if phase.op not in COMBINE_OF_OP:
            raise PhaseMismatch(f"step {step}: worker {rank} sent unknown op {phase.op!r}")
    first = phases[0]
    for rank, phase in enumerate(phases[1:], 1):
        if phase.op != first.op or phase.cells.size != first.cells.size:
            raise PhaseMismatch(
                f"step {step}: worker {rank} sent {Op(phase.op).name} x {phase.cells.size}, "
                f"worker 0 sent {Op(first.op).name} x {first.cells.size}"
            )


Tamper = Callable[[int, Phase, np.ndarray], np.ndarray]


def simulate(
    codecs_per_worker: Sequence[Codec],
    xs: Sequence[GradInput],
    *,
    timings: list[list[float]] | None = None,
    phases_log: list[Phase] | None = None,
    tamper: Tamper | None = None,
) -> list[np.ndarray]:
    """Run every worker's `aggregate(x)` in lockstep and return each worker's decoded sum.

    `timings`, when given, receives per worker the CPU-side seconds spent in each generator
    step (before the first phase, between phases, after the last); `phases_log` receives
    worker 0's phases; `tamper(step, phase, combined)` may alter the combined cells that
    every worker receives (fault injection). Raises PhaseMismatch if workers leave
    lockstep, or re-raises the error that every worker raised at the same step."""
    if len(codecs_per_worker) != len(xs):
        raise ValueError("one input per codec")
    gens = [c.aggregate(x) for c, x in zip(codecs_per_worker, xs)]
    return drive(gens, timings=timings, phases_log=phases_log, tamper=tamper)


def drive(
    gens: Sequence[Generator[Phase, np.ndarray, object]],
    *,
    timings: list[list[float]] | None = None,
    phases_log: list[Phase] | None = None,
    tamper: Tamper | None = None,
) -> list:
    """Drive already created generators in lockstep (see `simulate`); returns their values."""
    steps: list[list[float]] = [[] for _ in gens]
    results: list = [None] * len(gens)
    sends: list[np.ndarray | None] = [None] * len(gens)
    step = 0
    while True:
        phases: list[Phase | None] = [None] * len(gens)
        errors: list[BaseException | None] = [None] * len(gens)
        done = [False] * len(gens)
        for rank, gen in enumerate(gens):
            start = time.perf_counter()
            try:
                send = sends[rank]
                phases[rank] = next(gen) if send is None else gen.send(send)
            except StopIteration as stop:
                done[rank] = True
                results[rank] = stop.value
            except Exception as exc:
                errors[rank] = exc
            steps[rank].append(time.perf_counter() - start)
        if any(e is not None for e in errors):
            if not all(e is not None for e in errors):
                failed = [r for r, e in enumerate(errors) if e is not None]
                raise PhaseMismatch(f"step {step}: only workers {failed} failed") from next(
                    e for e in errors if e is not None
                )
            first = errors[0]
            assert first is not None
            raise first
        if any(done):
            if not all(done):
                raise PhaseMismatch(f"step {step}: some workers finished, others sent a phase")
            break
        _check_phases(phases, step)  # type: ignore[arg-type]
        if phases_log is not None:
            phases_log.append(phases[0])  # type: ignore[arg-type]
        combined = combine(phases[0].op, [p.cells for p in phases])  # type: ignore[union-attr]
        if tamper is not None:
            combined = tamper(step, phases[0], combined)  # type: ignore[arg-type]
        sends = [combined.copy() for _ in gens]
        step += 1
    if timings is not None:
        timings.extend(steps)
    return results
