"""Datagram channels between a worker and its switch: a UDP socket, and a wrapper that
injects loss, duplication and reordering for tests (tc netem is not available here).

A channel sends and receives one datagram at a time (`send`, `recv`: the transport's
per-datagram path). The batched path takes whole batches through `send_many` and
`recv_many` below: a UdpChannel's are one sendmmsg / recvmmsg each
(homagg/worker/transport/mmsg.py), the fault wrapper's pass batches through; any other
channel (tests' simulated switches) is driven datagram by datagram through its `send` and
`recv`."""

from __future__ import annotations

import logging
import random
import select
import socket
import time
from collections import deque
from functools import cache
from typing import Protocol

import numpy as np

from homagg.wire.frame import MAX_DATAGRAM_BYTES
from homagg.worker.transport.mmsg import MmsgSocket, mmsg_problem

log = logging.getLogger(__name__)
MMSG_BATCH = 256  # datagrams per sendmmsg / recvmmsg call
SEND_ONLY_ROW_BYTES = 2048  # the receive rows of a channel that has only sent yet
# The kernel charges a datagram's whole buffer (its `truesize`) to the socket: a 1,100-byte
# datagram costs ~2,300 bytes, a power of two of data and its sk_buff (measured on
# loopback), and SO_RCVBUF's value is doubled for that overhead. Asking for the next power
# of two above the datagram and this much per datagram leaves ~1.8x room.
SKB_OVERHEAD_BYTES = 320
MAX_RECEIVE_BUFFER = 64 << 20  # bytes asked at most (a pool of 16k one-KB results)
SO_RCVBUFFORCE = 33  # Linux (asm-generic/socket.h); Python's socket module does not name it


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
        self._mmsg: MmsgSocket | None = None
        self.batched = not mmsg_problem()  # sendmmsg / recvmmsg here
        if not self.batched:
            _note_no_mmsg()

    def _batch_socket(self, row_bytes: int | None) -> MmsgSocket:
        """The sendmmsg / recvmmsg state, receiving datagrams of up to `row_bytes` bytes
        (None: any state there is)."""
        if self._mmsg is None or row_bytes not in (None, self._mmsg.row_bytes):
            size = row_bytes or SEND_ONLY_ROW_BYTES
            self._mmsg = MmsgSocket(self.sock, self.service, MMSG_BATCH, size)
        return self._mmsg

    def send_many(self, rows: np.ndarray) -> None:
        """Send each row (uint8 (k, n)) as one datagram: one sendmmsg per MMSG_BATCH."""
        if not self.batched:
            for row in rows:
                self.send(row.tobytes())
            return
        self._batch_socket(None).send(rows)

    def recv_many(self, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """The datagrams from the service address waiting now, or within `timeout` s for
        the first: (rows cut at `row_bytes` bytes, each one's length, capped at
        `row_bytes`); the rows stay valid until the next call."""
        if not self.batched:
            return recv_many_slowly(self, timeout, row_bytes)
        mm = self._batch_socket(row_bytes)
        n, lengths, from_peer = mm.recv(timeout)
        rows = mm.rx_rows[:n]
        if not from_peer.all():  # anything from elsewhere is not ours: ignored
            return rows[from_peer], lengths[from_peer]
        return rows, lengths

    def hold_results(self, datagrams: int, datagram_bytes: int) -> int:
        """Size the socket's receive buffer to hold `datagrams` results of `datagram_bytes`
        bytes unread (a whole pool: a rank descheduled for 10 ms at 100 Mbit/s meets ~120
        results, past the system default's ~90, and each loss halves its window); never
        below what the system gave. SO_RCVBUFFORCE (root) where net.core.rmem_max caps
        SO_RCVBUF. Returns the buffer the kernel set (bytes, doubled as it reports it)."""
        per = 1 << max(0, datagram_bytes + SKB_OVERHEAD_BYTES - 1).bit_length()
        want = min(MAX_RECEIVE_BUFFER, datagrams * per)
        have = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        if have >= 2 * want:
            return have
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, want)
        have = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        if have < 2 * want:
            try:  # capped by net.core.rmem_max: root may go past it
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, want)
                have = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            except PermissionError:
                log.warning(
                    "the UDP receive buffer holds %d bytes, %d wanted for %d results: "
                    "results may be dropped at the socket (raise net.core.rmem_max to "
                    "%d, or run as root)",
                    have,
                    2 * want,
                    datagrams,
                    want,
                )
        return have

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
    passes (or a short while). Seeded, so a failing test can be replayed. Batches (the
    batched path's `send_many` / `recv_many`) meet the same faults datagram by datagram and
    reach the wrapped channel as batches.
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

    def send_many(self, rows: np.ndarray) -> None:
        """Send a batch through the faults, datagram by datagram as `send` decides, in one
        batch to the wrapped channel (one sendmmsg under a UdpChannel)."""
        out: list[bytes] = []
        for row in rows:
            fate = self._fate()
            if fate != "pass":
                self.injected[fate] += 1
            if fate == "lost":
                continue
            if fate == "reordered" and self._held_out is None:
                self._held_out = row.tobytes()
                continue
            out += [row.tobytes()] * (2 if fate == "duplicated" else 1)
            if self._held_out is not None and fate != "reordered":
                out.append(self._held_out)
                self._held_out = None
        if out and len({len(d) for d in out}) == 1:
            send_many(self.inner, np.frombuffer(b"".join(out), np.uint8).reshape(len(out), -1))
        else:
            for d in out:
                self.inner.send(d)

    def recv_many(self, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Receive a batch (one recvmmsg under a UdpChannel) through the faults, datagram by
        datagram as `recv` decides."""
        deadline = time.monotonic() + timeout
        while not self._inbox:
            if self._held_out is not None:  # a held-back send must not wait forever
                self.inner.send(self._held_out)
                self._held_out = None
            left = max(0.0, deadline - time.monotonic())
            wait = min(left, 0.005) if self._held_in is not None else left
            rows, lengths = recv_many(self.inner, wait, row_bytes)
            for row, length in zip(rows, lengths):
                self._arrived(row[:length].tobytes())
            if not lengths.size and self._held_in is not None:
                self._inbox.append(self._held_in)
                self._held_in = None
            elif not lengths.size and time.monotonic() >= deadline:
                break
        got = [self._inbox.popleft() for _ in range(len(self._inbox))]
        return _rows_of(got, row_bytes)

    def _arrived(self, data: bytes) -> None:
        """One datagram from the wrapped channel, through the faults, into the inbox."""
        fate = self._fate()
        if fate != "pass":
            self.injected[fate] += 1
        if fate == "lost":
            return
        if fate == "reordered" and self._held_in is None:
            self._held_in = data
            return
        self._inbox.extend([data] * (2 if fate == "duplicated" else 1))
        if self._held_in is not None:
            self._inbox.append(self._held_in)
            self._held_in = None

    def close(self) -> None:
        """Close the wrapped channel."""
        self.inner.close()


@cache
def _note_no_mmsg() -> None:
    """Say once per process that the UDP channels send and receive datagram by datagram."""
    log.warning(
        "homagg: batched datagram I/O unavailable (%s): one system call per datagram",
        mmsg_problem(),
    )


def recv_many_slowly(
    channel: Channel, timeout: float, row_bytes: int, limit: int = MMSG_BATCH
) -> tuple[np.ndarray, np.ndarray]:
    """`recv_many` of a channel that has only `recv`: the first datagram within `timeout`,
    then those already waiting, at most `limit`."""
    got: list[bytes] = []
    data = channel.recv(timeout)
    while data is not None:
        got.append(data)
        if len(got) >= limit:
            break
        data = channel.recv(0.0)
    return _rows_of(got, row_bytes)


def _rows_of(got: list[bytes], row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Datagrams as recv_many gives them: rows cut at `row_bytes` bytes, and lengths."""
    rows = np.zeros((len(got), row_bytes), np.uint8)
    lengths = np.zeros(len(got), np.int64)
    for i, d in enumerate(got):
        k = min(len(d), row_bytes)
        rows[i, :k] = np.frombuffer(d, np.uint8, k)
        lengths[i] = k
    return rows, lengths


def send_many(channel: Channel, rows: np.ndarray) -> None:
    """Send each row of `rows` (uint8 (k, n)) as one datagram, batched where the channel can."""
    batch = getattr(channel, "send_many", None)
    if batch is not None:
        batch(rows)
        return
    for row in rows:
        channel.send(row.tobytes())


def recv_many(channel: Channel, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """The datagrams waiting (or within `timeout` s for the first): rows cut at `row_bytes`
    bytes and their lengths (capped at `row_bytes`), batched where the channel can."""
    batch = getattr(channel, "recv_many", None)
    if batch is not None:
        rows, lengths = batch(timeout, row_bytes)
        return rows, lengths
    return recv_many_slowly(channel, timeout, row_bytes)
