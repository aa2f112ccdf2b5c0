"""Work run side by side in threads of this process and waited for with a bound, for
benchmarks and tests that drive several workers' transports at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def run_threads(
    work: Sequence[Callable[[], T]], timeout: float, *, return_errors: bool = False
) -> tuple[float, list[T]]:
    """Start every callable in a daemon thread of its own and wait for all of them within
    `timeout` s in total: (wall seconds, their results in order). A thread still running at
    the end is a RuntimeError (daemon: it cannot keep the process alive); else the first
    exception any of them raised is re-raised, or with `return_errors` it stands in the
    results in place of that callable's result."""
    results: list = [None] * len(work)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = work[i]()
        except BaseException as exc:
            errors.append(exc)
            if return_errors:
                results[i] = exc

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(work))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, timeout - (time.perf_counter() - start)))
    elapsed = time.perf_counter() - start
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    if hung:
        raise RuntimeError(f"worker(s) {hung} of {len(work)} still running after {timeout:.0f} s")
    if errors and not return_errors:
        raise errors[0]
    return elapsed, results
