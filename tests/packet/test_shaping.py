"""Shaped links stay shaped: a link shaped to RATE carries no more than RATE, in both
directions, on every target. The eBPF target's redirects go through the egress device's
qdisc (TC, not XDP_REDIRECT, which would bypass it: docs/ebpf.md); the others send from
raw sockets, which go through it too. One host floods another with routed UDP; a tbf
on the switch's end of the receiver's link (switch to host) or on the sender's host end
(host to switch) must hold the delivered bytes to RATE, where the same flood unshaped
delivers several times as much (so the measurement can tell)."""

from __future__ import annotations

import contextlib
import subprocess
import time

import pytest

from homagg.lab.fabric import SWITCH_MAC, Fabric
from homagg.wire.constants import (
    AGG_UDP_LENGTH,
    ETH_HEADER_BYTES,
    IPV4_HEADER_BYTES,
    UDP_HEADER_BYTES,
)
from homagg.wire.frame import FrameTemplate

RATE_BITS = 2_000_000  # tbf rate, bit/s: below what even BMv2 forwards of a flood
BURST_BYTES = 16_000
FLOOD_S = 2.0
SETTLE_S = 0.5  # after the flood: what tbf still holds drains
FLOW_PORT = 6000
FLOW_TAG = FLOW_PORT.to_bytes(2, "big")
DPORT_AT = ETH_HEADER_BYTES + IPV4_HEADER_BYTES + 2  # the UDP destination port's offset
SLACK = 1.15


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 2, tmp_path_factory.mktemp(target)) as f:
        yield f


def _tbf(namespace: str, iface: str, on: bool) -> None:
    """Shape iface's egress to RATE_BITS (on), or take the shaping off."""
    if on:
        rate, burst = f"{RATE_BITS}bit", str(BURST_BYTES)
        args = ["root", "tbf", "rate", rate, "burst", burst, "latency", "50ms"]
        _tc(namespace, ["qdisc", "replace", "dev", iface, *args])
    else:
        _tc(namespace, ["qdisc", "del", "dev", iface, "root"], check=False)


def _tc(namespace: str, args: list[str], check: bool = True) -> None:
    done = subprocess.run(
        ["tc", "-n", namespace, *args], capture_output=True, text=True, timeout=20
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()}")


def delivered_bits_per_s(fabric: Fabric) -> float:
    """Host 0 floods host 1 (routed by the switch) for FLOOD_S; host 1's received rate."""
    h0, h1 = fabric.hosts[0], fabric.hosts[1]
    frame = FrameTemplate(h0.mac, SWITCH_MAC, h0.ip, h1.ip, 5000, FLOW_PORT).frame(
        bytes(AGG_UDP_LENGTH - UDP_HEADER_BYTES)
    )
    fabric.drain()
    received = 0
    deadline = time.monotonic() + FLOOD_S
    while time.monotonic() < deadline:
        for _ in range(64):
            # a full qdisc on the sender's side may refuse the frame
            with contextlib.suppress(OSError):
                h0.raw.send(frame)
        received += _flow_bytes(h1.raw.receive(0.0))
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        received += _flow_bytes(h1.raw.receive(0.05))
    return 8 * received / (FLOOD_S + SETTLE_S)


def _flow_bytes(frames: list[bytes]) -> int:
    return sum(len(f) for f in frames if f[DPORT_AT : DPORT_AT + 2] == FLOW_TAG)


def test_an_unshaped_flood_exceeds_the_rate(fabric, target):
    rate = delivered_bits_per_s(fabric)
    print(f"{target} unshaped: {rate / 1e6:.1f} Mbit/s delivered")
    assert rate > 2 * RATE_BITS


@pytest.mark.parametrize("direction", ["switch-to-host", "host-to-switch"])
def test_a_shaped_link_carries_no_more_than_its_rate(fabric, target, direction):
    h0, h1 = fabric.hosts[0], fabric.hosts[1]
    if direction == "switch-to-host":
        where = (fabric.switch_namespace, h1.switch_iface)  # what the switch sends to host 1
    else:
        where = (h0.namespace, h0.iface)  # what host 0 sends to the switch
    _tbf(*where, on=True)
    try:
        rate = delivered_bits_per_s(fabric)
    finally:
        _tbf(*where, on=False)
    print(f"{target} {direction} shaped to {RATE_BITS / 1e6:g}: {rate / 1e6:.2f} Mbit/s")
    assert rate <= SLACK * RATE_BITS + 8 * BURST_BYTES / (FLOOD_S + SETTLE_S), rate
    assert rate > RATE_BITS / 4, f"{rate}: hardly anything arrived"
