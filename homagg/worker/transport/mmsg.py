"""Batched datagram I/O on a UDP socket: sendmmsg(2) and recvmmsg(2) from the C library
through ctypes, so a batch of datagrams costs one system call and no compiler is needed.

The message headers are built once per socket over fixed buffers and reused (numpy views
set the few fields that change per call); ctypes releases the GIL during each call, and
the waits are poll(2)s that release it too. Where the C library lacks the calls (not
Linux), `mmsg_problem()` says why and the channels send and receive datagram by datagram.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import socket
import struct
import time
from functools import cache

import numpy as np

MSG_DONTWAIT = 0x40
SOCKADDR_IN_BYTES = 16
_NO_LENGTHS = np.zeros(0, np.int64)  # an empty receive's (read-only: shared)
_NO_PEERS = np.zeros(0, bool)
_NO_LENGTHS.flags.writeable = _NO_PEERS.flags.writeable = False


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class _MsgHdr(ctypes.Structure):
    _fields_ = (
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.c_void_p),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    )


class _MMsgHdr(ctypes.Structure):
    _fields_ = (("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint))


@cache
def _libc() -> tuple[ctypes.CDLL | None, str]:
    """The C library with sendmmsg and recvmmsg typed, or (None, why not)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        send, recv = libc.sendmmsg, libc.recvmmsg
    except (OSError, AttributeError, TypeError) as exc:
        return None, f"the C library has no sendmmsg/recvmmsg ({exc})"
    send.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
    recv.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p)
    send.restype = recv.restype = ctypes.c_int
    return libc, ""


def mmsg_problem() -> str:
    """Why batched system calls are not available here ("" when they are)."""
    return _libc()[1]


def _sockaddr_in(addr: tuple[str, int]) -> bytes:
    """struct sockaddr_in of an IPv4 address and port (Linux layout)."""
    return (
        struct.pack("=H", socket.AF_INET)
        + struct.pack("!H4s", addr[1], socket.inet_aton(addr[0]))
        + bytes(8)
    )


class _Headers:
    """`count` mmsghdr with one iovec each, and a numpy view of their fields."""

    def __init__(self, count: int) -> None:
        self.msgs = (_MMsgHdr * count)()
        self.iovs = (_IoVec * count)()
        iov_base = ctypes.addressof(self.iovs)
        for i in range(count):
            self.msgs[i].msg_hdr.msg_iov = iov_base + i * ctypes.sizeof(_IoVec)
            self.msgs[i].msg_hdr.msg_iovlen = 1
        self.view = np.frombuffer(memoryview(self.msgs), np.dtype(_MMsgHdr))
        self.iov_view = np.frombuffer(memoryview(self.iovs), np.dtype(_IoVec))
        self.address = ctypes.addressof(self.msgs)


class MmsgSocket:
    """sendmmsg / recvmmsg on a non-blocking UDP socket towards one peer: up to `batch`
    datagrams per call, received into a fixed (batch, row_bytes) buffer."""

    def __init__(self, sock: socket.socket, peer: tuple[str, int], batch: int, row_bytes: int):
        libc, problem = _libc()
        if libc is None:
            raise OSError(errno.ENOSYS, problem)
        self.sock, self.batch, self.row_bytes = sock, batch, row_bytes
        self._send_call, self._recv_call = libc.sendmmsg, libc.recvmmsg
        self._peer = _sockaddr_in(peer)
        self._peer_buf = ctypes.create_string_buffer(self._peer, SOCKADDR_IN_BYTES)
        self._tx = _Headers(batch)
        self._tx.view["msg_hdr"]["msg_name"] = ctypes.addressof(self._peer_buf)
        self._tx.view["msg_hdr"]["msg_namelen"] = SOCKADDR_IN_BYTES
        self._rx = _Headers(batch)
        self.rx_rows = np.zeros((batch, row_bytes), np.uint8)
        self._names = np.zeros((batch, SOCKADDR_IN_BYTES), np.uint8)
        rows, names = self.rx_rows.ctypes.data, self._names.ctypes.data
        self._rx.view["msg_hdr"]["msg_name"] = names + SOCKADDR_IN_BYTES * np.arange(batch)
        self._rx.iov_view["iov_base"] = rows + row_bytes * np.arange(batch)
        self._rx.iov_view["iov_len"] = row_bytes
        self._peer_row = np.frombuffer(self._peer, np.uint8)[:8]  # family, port, address
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)

    def send(self, rows: np.ndarray) -> None:
        """Send every row of `rows` (uint8, C-contiguous (k, n)) as one datagram each; a full
        socket buffer is waited out briefly, like a wire would queue; OSError otherwise."""
        rows = np.ascontiguousarray(rows, np.uint8)
        fd, done, give_up = self.sock.fileno(), 0, None
        while done < rows.shape[0]:
            k = min(self.batch, rows.shape[0] - done)
            iov = self._tx.iov_view[:k]
            iov["iov_base"] = rows.ctypes.data + rows.strides[0] * np.arange(done, done + k)
            iov["iov_len"] = rows.shape[1]
            n = self._send_call(fd, self._tx.address, k, MSG_DONTWAIT)
            if n > 0:
                done += n
                continue
            err = ctypes.get_errno()
            if err not in (errno.EAGAIN, errno.ENOBUFS, errno.EINTR):
                raise OSError(err, os.strerror(err))
            give_up = give_up or time.monotonic() + 1.0
            if time.monotonic() > give_up:
                raise OSError("UDP send buffer stayed full for 1 s")
            select.select([], [self.sock], [], 0.01)

    def recv(self, timeout: float) -> tuple[int, np.ndarray, np.ndarray]:
        """Receive the datagrams waiting, waiting up to `timeout` s for the first: (count,
        each one's length, whether it came from the peer); the datagrams are rows
        0 .. count - 1 of `rx_rows` (longer ones cut at row_bytes), until the next call."""
        n = self._recv_now()
        if n == 0 and timeout > 0 and self._poll.poll(max(1, int(np.ceil(timeout * 1e3)))):
            n = self._recv_now()
        if n == 0:
            return 0, _NO_LENGTHS, _NO_PEERS
        view = self._rx.view[:n]
        lengths = view["msg_len"].astype(np.int64)
        from_peer = (self._names[:n, :8] == self._peer_row).all(axis=1)
        return n, lengths, from_peer

    def _recv_now(self) -> int:
        """recvmmsg without waiting: how many datagrams came (0: none)."""
        self._rx.view["msg_hdr"]["msg_namelen"] = SOCKADDR_IN_BYTES
        n = self._recv_call(self.sock.fileno(), self._rx.address, self.batch, MSG_DONTWAIT, None)
        if n >= 0:
            return int(n)
        err = ctypes.get_errno()
        if err in (errno.EAGAIN, errno.EINTR):
            return 0
        raise OSError(err, os.strerror(err))
