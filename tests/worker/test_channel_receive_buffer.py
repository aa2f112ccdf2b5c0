"""A worker's UDP channel holds a whole pool of results unread (UdpChannel.hold_results): a
rank that the scheduler leaves off the CPU while its window's results arrive loses none at
the socket. With the system's default buffer (~208 KB) a 1 KB result costs ~2.3 KB of it,
so about 90 fit: on 100 Mbit/s links that was 10 ms of a rank's results, and every loss
halved its window."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from homagg.wire.constants import agg_udp_length
from homagg.worker.transport.channel import UdpChannel

POOL = 1024
DATAGRAM = agg_udp_length(256)  # a result of 256 cells (the default packet)


@pytest.fixture
def pair() -> Iterator[tuple[UdpChannel, socket.socket]]:
    """A channel bound on loopback, and a socket that plays the switch's service."""
    service = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    service.bind(("127.0.0.1", 0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    channel = UdpChannel(sock, service.getsockname())
    yield channel, service
    channel.close()
    service.close()


def unread_after(channel: UdpChannel, service: socket.socket, count: int) -> int:
    """How many of `count` results sent at once are still there to read."""
    payload = b"r" * (DATAGRAM - 8)  # the UDP header is the kernel's
    for _ in range(count):
        service.sendto(payload, channel.sock.getsockname())
    got = 0
    while channel.recv(0.0) is not None:
        got += 1
    return got


def test_a_channel_holds_its_pool_of_results_unread(pair):
    channel, service = pair
    have = channel.hold_results(POOL, DATAGRAM)
    if have < 2 * POOL * DATAGRAM and os.geteuid() != 0:
        pytest.skip(f"net.core.rmem_max caps the buffer at {have} bytes and this is not root")
    assert unread_after(channel, service, POOL) == POOL


def test_the_default_buffer_loses_a_pool_so_the_test_can_fail(pair):
    channel, service = pair
    if channel.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= POOL * 2 * DATAGRAM:
        pytest.skip("this system's default receive buffer already holds a pool")
    assert unread_after(channel, service, POOL) < POOL


def test_holding_never_shrinks_a_larger_buffer(pair):
    channel, _ = pair
    channel.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    before = channel.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    assert channel.hold_results(4, DATAGRAM) == before
