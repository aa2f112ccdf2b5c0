"""Bounds on parked WaitReady calls. The gRPC server runs each call on one of `rpc_threads`
request threads and a WaitReady holds its thread while it waits, so without bounds a client
that parks enough of them leaves no thread for other tenants' heartbeats (whose leases then
expire) or for operators. Parked calls are bounded three ways: one per rank of a job (a
newer call of the same rank supersedes the older, which answers ABORTED), `per_client` per
client address and `total` overall (beyond either: RESOURCE_EXHAUSTED), and `total` is below
the thread count, so heartbeats and operator calls always find a free thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from controller.errors import ResourceExhausted


class Ticket:
    """One admitted WaitReady; `superseded` is set when a newer call of its rank arrived."""

    __slots__ = ("client", "done", "key", "superseded")

    def __init__(self, key: tuple[int, int], client: str) -> None:
        self.key, self.client = key, client
        self.superseded = False
        self.done = False


def client_host(peer: str) -> str:
    """The client part of a gRPC peer string: 'ipv4:10.0.0.1:5000' -> '10.0.0.1'."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0] or rest
    return peer


class WaitLimiter:
    """Counts parked WaitReady calls per rank, per client and in total (thread-safe)."""

    def __init__(self, total: int, per_client: int, wake: Callable[[], None]) -> None:
        self.total, self.per_client = total, per_client
        self._wake = wake  # wakes every waiter, so a superseded one notices at once
        self._lock = threading.Lock()
        self._tickets: list[Ticket] = []
        self._by_rank: dict[tuple[int, int], Ticket] = {}
        self.refused = 0
        self.superseded = 0

    @property
    def parked(self) -> int:
        """WaitReady calls holding a request thread now."""
        with self._lock:
            return len(self._tickets)

    @contextmanager
    def admit(self, job_id: int, rank: int, client: str) -> Iterator[Ticket]:
        """Admit a WaitReady of (job, rank) from client for the duration of the block, or
        raise ResourceExhausted naming the limit that was reached."""
        ticket = Ticket((job_id, rank), client)
        with self._lock:
            older = self._by_rank.get(ticket.key)
            if older is None:
                self._check_room(client)
            else:
                older.superseded = True
                self.superseded += 1
            self._by_rank[ticket.key] = ticket
            self._tickets.append(ticket)
        if older is not None:
            self._wake()
        try:
            yield ticket
        finally:
            with self._lock:
                ticket.done = True
                self._tickets.remove(ticket)
                if self._by_rank.get(ticket.key) is ticket:
                    del self._by_rank[ticket.key]

    def _check_room(self, client: str) -> None:
        live = [t for t in self._tickets if not t.superseded]  # superseded ones are leaving
        if len(live) >= self.total:
            self.refused += 1
            raise ResourceExhausted(
                f"{len(live)} WaitReady calls are already waiting, the controller's "
                f"limit (controller.wait_ready_limit); retry later"
            )
        mine = sum(t.client == client for t in live)
        if mine >= self.per_client:
            self.refused += 1
            raise ResourceExhausted(
                f"{mine} WaitReady calls from {client} are already waiting, the limit per "
                f"client (controller.wait_ready_per_client); retry later"
            )
