"""One collective exchange of a job's set-up through a process group's store: every rank
posts a JSON value, rank 0 reads them (waiting a bounded time for each), decides, and posts
one answer that every rank reads. Nothing read from the store is unpickled.

Used by `homagg.attach` and the homagg backend, so every rank takes part in the same
exchanges in the same order whatever its environment, and a rank that never shows up
costs the others a bounded wait instead of a hang. Rounds are numbered per rank (a counter
in the store): a rank that skipped a round never meets a later round's keys, and a store
that outlives the process group (torchrun's) never serves a previous round's answer."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

Decide = Callable[[dict[int, Any]], Any]
"""Rank 0's decision from the values posted by each rank that did within the wait."""


class SetupRound:
    """One numbered round of exchanges among `world_size` ranks of one store (see module)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, prefix: str) -> None:
        self.store = dist.PrefixStore(prefix, store)
        self.rank, self.world_size = rank, world_size
        self.number = int(self.store.add(f"round/{rank}", 1))

    def _key(self, step: str, rank: int | None = None) -> str:
        tail = "answer" if rank is None else f"from/{rank}"
        return f"{self.number}/{step}/{tail}"

    def exchange(
        self, step: str, value: Any, gather_s: float, answer_s: float, decide: Decide
    ) -> Any:
        """Post `value`; rank 0 waits up to `gather_s` for the others' values and posts
        decide(values); every rank returns that answer, or None when rank 0's did not come
        within `answer_s` (rank 0 itself always gets its own answer)."""
        self.store.set(self._key(step, self.rank), json.dumps(value))
        if self.rank == 0:
            answer = decide(self._gather(step, gather_s))
            self.store.set(self._key(step), json.dumps(answer))
            return answer
        try:
            self.store.wait([self._key(step)], timedelta(seconds=answer_s))
        except RuntimeError:  # the store's wait timeout (DistStoreError is a RuntimeError)
            return None
        return json.loads(self.store.get(self._key(step)))

    def _gather(self, step: str, timeout_s: float) -> dict[int, Any]:
        keys = [self._key(step, r) for r in range(self.world_size)]
        with contextlib.suppress(RuntimeError):  # a rank missing: the others still count
            self.store.wait(keys, timedelta(seconds=timeout_s))
        got = {}
        for r, key in enumerate(keys):
            if self.store.check([key]):
                got[r] = json.loads(self.store.get(key))
                self.store.delete_key(key)
        return got

    def forget(self, step: str) -> None:
        """Rank 0: delete the step's answer (a secret in it leaves the store once every rank
        has read it: a later step's values prove that)."""
        if self.rank == 0:
            with contextlib.suppress(RuntimeError):
                self.store.delete_key(self._key(step))
