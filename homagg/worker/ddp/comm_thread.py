"""One communication thread per rank: jobs (a bucket's aggregation) run one at a time in the
order they were submitted, each completing a `torch.futures.Future`. Every rank submits its
buckets in the same order, so every collective a job issues is issued in the same order on
every rank, from this one thread only (docs/worker.md: overlap)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

_STOP = object()


class CommThread:
    """A daemon thread that runs submitted callables in FIFO order and sets each one's
    Future to its result (or to its exception: the waiter sees it, the thread carries on)."""

    def __init__(self, name: str = "homagg-comm") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._idle = threading.Condition()
        self._pending = 0
        self._closed = False
        self._thread.start()

    def submit(self, job: Callable[[], Any]) -> torch.futures.Future:
        """Queue `job`; the returned Future completes with its return value."""
        if self._closed:
            raise RuntimeError("the communication thread was closed")
        fut: torch.futures.Future = torch.futures.Future()
        with self._idle:
            self._pending += 1
        self._jobs.put((job, fut))
        return fut

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished yet."""
        return self._pending

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has finished; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued jobs, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._jobs.put(_STOP)
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            job, fut = item
            try:
                result = job()
            except BaseException as exc:  # the waiter re-raises it
                log.debug("communication job failed: %s", exc)
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
