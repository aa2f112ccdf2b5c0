"""Frames the kernel drops before the reference switch reads them (its socket's receive
buffer full) are counted per port from the socket's statistics, so every frame sent to the
switch is accounted for: read by the pipeline, or counted as a kernel drop."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import socket
import time

import pytest

from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.counters import read_counters
from homagg.control.service import switch_counters
from homagg.control.switch_connection import SwitchConnection
from homagg.control.text_table import render_counters
from homagg.lab.namespace import (
    add_namespace,
    add_veth,
    delete_link,
    delete_namespace,
    have_privileges,
    in_namespace,
    ip,
    sysctl,
)
from homagg.lab.rawsock import open_raw, recv_frames
from homagg.lab.switch_process import free_port
from homagg.refswitch.ports import PortSet, parse_port_spec, socket_drops
from homagg.refswitch.switch import KERNEL_DROPS_REASON, ReferenceSwitch

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (a veth pair in a namespace)"
)

FRAME = bytes.fromhex("02000000000202000000000188b5") + bytes(200)  # local experimental


@pytest.fixture
def link():
    """(switch side interface in this namespace, host side in a namespace of its own)."""
    tag = f"kd{os.getpid() % 100000}"
    ns, outside, inside = f"{tag}ns", f"{tag}s", f"{tag}h"
    add_namespace(ns)
    try:
        add_veth(outside, inside, ns)
        sysctl(f"net.ipv6.conf.{inside}.disable_ipv6", "1", netns=ns)
        yield outside, ns, inside
    finally:
        delete_link(outside)
        delete_namespace(ns)


def _flood(ns: str, iface: str, count: int) -> None:
    with in_namespace(ns):
        sock = open_raw(iface)
    try:
        for _ in range(count):
            with contextlib.suppress(BlockingIOError):  # our own queue full: fewer arrive
                sock.send(FRAME)
    finally:
        sock.close()


def test_socket_drops_reads_and_resets(link):
    outside, ns, inside = link
    sock = open_raw(outside, rcvbuf=64 << 10)
    try:
        assert socket_drops(sock) == 0
        _flood(ns, inside, 3000)
        got = len(recv_frames(sock, limit=100000))
        dropped = socket_drops(sock)
        assert dropped > 0 and got + dropped >= 2900
        assert socket_drops(sock) == 0  # reading resets the kernel's count
    finally:
        sock.close()


def test_port_set_counts_kernel_drops_per_port_and_in_the_drop_counter(link):
    """The kernel drops are counted per port, in the drop summary, and in the P4 ingress drop
    counter's KERNEL_RX_OVERFLOW cell, so `aggctl counters` lists them."""
    outside, ns, inside = link
    address = f"127.0.0.1:{free_port()}"
    switch = ReferenceSwitch({parse_port_spec(f"3@{outside}")[0]: outside}, address)
    switch.start()
    conn = SwitchConnection(address, election_id=1, timeout=5.0)
    try:
        conn.connect()
        conn.set_pipeline(P4INFO_PATH, BMV2_JSON_PATH)
        assert switch.ports is not None and switch.ports.kernel_drops == {3: 0}
        for sock in switch.ports._socks.values():
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        _flood(ns, inside, 3000)  # nobody reads: the buffer overflows
        read = len(switch.ports.poll(0.5))
        switch._count_kernel_drops()
        dropped = switch.ports.kernel_drops[3]
        assert dropped > 0 and read + dropped >= 2900
        assert switch.pipeline.drops[KERNEL_DROPS_REASON.name] == dropped
        counted = read_counters(conn, "s1", {})
        cell = next(v for v in counted.ingress_drops if v.name == "KERNEL_RX_OVERFLOW")
        assert (cell.index, cell.packets) == (KERNEL_DROPS_REASON, dropped)
        shown = render_counters([switch_counters(counted)], False)
        assert re.search(rf"KERNEL_RX_OVERFLOW\s+{dropped}\b", shown), shown
    finally:
        conn.close()
        switch.close()


def test_a_port_whose_link_goes_down_ends_quietly_and_a_real_error_still_shows(
    link, monkeypatch, caplog
):
    """At a normal shutdown a port's link goes away (ENETDOWN on its socket): that port closes
    with one log line, the others go on; any other socket error is raised."""
    outside, _, _ = link
    ports = PortSet({3: outside})
    try:
        ip("link", "set", outside, "down")
        with caplog.at_level(logging.INFO, logger="homagg.refswitch.ports"):
            deadline = time.monotonic() + 5
            while 3 in ports._socks and time.monotonic() < deadline:
                assert ports.poll(0.2) == []
        assert 3 not in ports._socks and "port 3 (" in caplog.text and "link gone" in caplog.text
        ports.send(3, FRAME)  # dropped as to a port without an interface
        assert ports.tx_errors == 0
    finally:
        ports.close()
    ip("link", "set", outside, "up")
    ports = PortSet({3: outside})

    def broken(sock: socket.socket) -> list[bytes]:
        raise OSError(errno.EIO, "I/O error")

    try:
        monkeypatch.setattr("homagg.refswitch.ports.recv_frames", broken)
        key = ports._selector.get_key(ports._socks[3])
        monkeypatch.setattr(ports._selector, "select", lambda timeout: [(key, 1)])
        with pytest.raises(OSError, match="I/O error"):
            ports.poll(0.2)
    finally:
        ports.close()
