"""Bounds on parked WaitReady calls. The gRPC server runs each call on one of `rpc_threads`
request threads and a WaitReady holds its thread while it waits, so without bounds a client
that parks enough of them leaves no thread for other tenants' heartbeats (whose leases then
expire) or for operators. Parked calls are bounded three ways: one per rank of a job (a
newer call of the same rank supersedes the older, which answers ABORTED), `per_client` per
client address and `total` overall, and `total` is below the thread count, so heartbeats
and operator calls always find a free thread.

Within both bounds the calls are shared fairly between job owners (the operator credential
that created the job; a job created without one is an owner of its own): a call that finds
a bound reached takes the place of the newest call of the owner holding the most, as long
as that owner holds at least two more than the caller; otherwise it is refused
(RESOURCE_EXHAUSTED) naming the caller's share. A place given up so answers
RESOURCE_EXHAUSTED, which the worker agent retries. So one tenant's waits never refuse
another tenant's first wait, and tenants that wait at once end up with equal shares."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from homagg.api.errors import ResourceExhausted


class Ticket:
    """One admitted WaitReady; `superseded` is set when a newer call of its rank arrived,
    `evicted` (the key of the bound) when it gave its place to another owner's call."""

    __slots__ = ("client", "done", "evicted", "key", "owner", "superseded")

    def __init__(self, key: tuple[int, int], client: str, owner: str) -> None:
        self.key, self.client, self.owner = key, client, owner
        self.superseded = False
        self.evicted = ""
        self.done = False

    @property
    def leaving(self) -> bool:
        """Superseded or evicted: it answers as soon as it wakes, its place is taken."""
        return self.superseded or bool(self.evicted)


def client_host(peer: str) -> str:
    """The client part of a gRPC peer string: 'ipv4:10.0.0.1:5000' -> '10.0.0.1'."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0] or rest
    return peer


class WaitLimiter:
    """Counts parked WaitReady calls per rank, per client and in total, shared fairly between
    job owners (thread-safe)."""

    def __init__(self, total: int, per_client: int, wake: Callable[[], None]) -> None:
        self.total, self.per_client = total, per_client
        self._wake = wake  # wakes every waiter, so a superseded or evicted one notices at once
        self._lock = threading.Lock()
        self._tickets: list[Ticket] = []
        self._by_rank: dict[tuple[int, int], Ticket] = {}
        self.refused = 0
        self.superseded = 0
        self.evicted = 0

    @property
    def parked(self) -> int:
        """WaitReady calls holding a request thread now."""
        with self._lock:
            return len(self._tickets)

    def held(self) -> Counter[str]:
        """The calls each owner has waiting now (those leaving not counted)."""
        with self._lock:
            return Counter(t.owner for t in self._tickets if not t.leaving)

    @contextmanager
    def admit(self, job_id: int, rank: int, client: str, owner: str) -> Iterator[Ticket]:
        """Admit a WaitReady of (job, rank) from client, for a job of `owner`, for the duration
        of the block, or raise ResourceExhausted naming the limit and the owner's share."""
        ticket = Ticket((job_id, rank), client, owner)
        with self._lock:
            older = self._by_rank.get(ticket.key)
            if older is None or older.evicted:  # an evicted call's place is another's now
                evicted = self._make_room(client, owner)
            else:
                older.superseded, evicted = True, False
                self.superseded += 1
            self._by_rank[ticket.key] = ticket
            self._tickets.append(ticket)
        if evicted or older is not None:
            self._wake()
        try:
            yield ticket
        finally:
            with self._lock:
                ticket.done = True
                self._tickets.remove(ticket)
                if self._by_rank.get(ticket.key) is ticket:
                    del self._by_rank[ticket.key]

    def _make_room(self, client: str, owner: str) -> bool:
        """Room for one more call of `owner` from `client` (lock held): True when a call of
        another owner gave its place, ResourceExhausted when there is none."""
        live = [t for t in self._tickets if not t.leaving]
        mine = [t for t in live if t.client == client]
        evicted = False
        if len(mine) >= self.per_client:
            self._evict(mine, owner, f"from {client}", "wait_ready_per_client")
            evicted = True
            live = [t for t in live if not t.leaving]
        if len(live) >= self.total:
            self._evict(live, owner, "", "wait_ready_limit")
            evicted = True
        return evicted

    def _evict(self, scope: list[Ticket], owner: str, where: str, key: str) -> None:
        """Evict the newest call of the owner holding the most in `scope` (at least two more
        than `owner`), or raise ResourceExhausted naming `owner`'s share of the limit."""
        counts = Counter(t.owner for t in scope)
        others = [(n, o) for o, n in counts.items() if o != owner]
        most, biggest = max(others, default=(0, ""))
        if most < counts[owner] + 2:
            self.refused += 1
            shared = len(counts) + (owner not in counts)
            raise ResourceExhausted(
                f"{owner} has {counts[owner]} of the {len(scope)} WaitReady calls waiting "
                f"{where + ' ' if where else ''}(controller.{key}), its fair share while "
                f"{shared} job owner(s) wait; retry later"
            )
        victim = next(t for t in reversed(scope) if t.owner == biggest)
        victim.evicted = key
        self.evicted += 1
