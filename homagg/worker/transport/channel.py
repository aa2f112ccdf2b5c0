"""Datagram channels between a worker and its switch: a UDP socket, and a wrapper that
injects loss, duplication and reordering for tests (tc netem is not available here)."""

from __future__ import annotations

import random
import select
import socket
import time
from collections import deque
from typing import Protocol

from homagg.wire.frame import MAX_DATAGRAM_BYTES


class Channel(Protocol):
    """Sends aggregation payloads to the switch and receives results."""

    def send(self, payload: bytes) -> None:
        """Send one UDP payload to the switch's service address."""
        ...

    def recv(self, timeout: float) -> bytes | None:
        """The next datagram received within timeout seconds, or None."""
        ...

    def close(self) -> None:
        """Release the socket."""
        ...


class UdpChannel:
    """A UDP socket bound to the worker's address, talking to the switch's service address."""

    def __init__(self, sock: socket.socket, service: tuple[str, int]) -> None:
        self.sock = sock
        self.service = service
        self.sock.setblocking(False)

    def send(self, payload: bytes) -> None:
        """Send one datagram; a full socket buffer is waited out briefly, like a wire would
        queue."""
        for _ in range(100):
            try:
                self.sock.sendto(payload, self.service)
                return
            except BlockingIOError:
                select.select([], [self.sock], [], 0.01)
        raise OSError("UDP send buffer stayed full for 1 s")

    def recv(self, timeout: float) -> bytes | None:
        """The next datagram from the switch's service address within timeout, else None."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                data, peer = self.sock.recvfrom(MAX_DATAGRAM_BYTES)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    return None
                continue
            if peer == self.service:
                return data
            # anything from elsewhere is not ours: ignored

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class FaultyChannel:
    """Wraps a channel and loses, duplicates or reorders datagrams in both directions.

    Probabilities are per datagram; reordering holds a datagram back until the next one
    passes (or a short while). Seeded, so a failing test can be replayed.
    """

    def __init__(
        self,
        inner: Channel,
        loss: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.inner = inner
        self.loss, self.duplicate, self.reorder = loss, duplicate, reorder
        self.rng = random.Random(seed)
        self._held_out: bytes | None = None
        self._inbox: deque[bytes] = deque()
        self._held_in: bytes | None = None
        self.injected = {"lost": 0, "duplicated": 0, "reordered": 0}

    def _fate(self) -> str:
        r = self.rng.random()
        if r < self.loss:
            return "lost"
        if r < self.loss + self.duplicate:
            return "duplicated"
        if r < self.loss + self.duplicate + self.reorder:
            return "reordered"
        return "pass"

    def send(self, payload: bytes) -> None:
        """Send through the faults."""
        fate = self._fate()
        if fate != "pass":
            self.injected[fate] += 1
        if fate == "lost":
            return
        if fate == "reordered" and self._held_out is None:
            self._held_out = payload
            return
        self.inner.send(payload)
        if fate == "duplicated":
            self.inner.send(payload)
        if self._held_out is not None and fate != "reordered":
            self.inner.send(self._held_out)
            self._held_out = None

    def recv(self, timeout: float) -> bytes | None:
        """Receive through the faults."""
        deadline = time.monotonic() + timeout
        while True:
            if self._inbox:
                return self._inbox.popleft()
            if self._held_out is not None:  # a held-back send must not wait forever
                self.inner.send(self._held_out)
                self._held_out = None
            left = max(0.0, deadline - time.monotonic())
            data = self.inner.recv(min(left, 0.005) if self._held_in is not None else left)
            if data is None:
                if self._held_in is not None:
                    self._inbox.append(self._held_in)
                    self._held_in = None
                    continue
                if time.monotonic() >= deadline:
                    return None
                continue
            fate = self._fate()
            if fate != "pass":
                self.injected[fate] += 1
            if fate == "lost":
                continue
            if fate == "reordered" and self._held_in is None:
                self._held_in = data
                continue
            self._inbox.append(data)
            if fate == "duplicated":
                self._inbox.append(data)
            if self._held_in is not None:
                self._inbox.append(self._held_in)
                self._held_in = None

    def close(self) -> None:
        """Close the wrapped channel."""
        self.inner.close()
