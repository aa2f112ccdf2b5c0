"""Ordinary traffic: proxy ARP, IPv4 routing with neighbor rewriting, counted drops."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from packet_checks import assert_routed_unchanged
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from homagg.lab.aggjob import CounterDelta, Job
from homagg.lab.fabric import SERVICE_IP, SWITCH_MAC, Fabric
from homagg.lab.namespace import in_namespace
from homagg.lab.rawsock import recv_frames
from homagg.wire.constants import AGG_UDP_PORT, CELLS_PER_PKT, DropReason, Flag, Op
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import AggHeader
from homagg.wire.packer import pack_payload

QUIET = 0.3


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    with Fabric(target, 3, tmp_path_factory.mktemp(target)) as f:
        for h in f.hosts:
            h.enable_ip_stack()
        yield f


def _udp_frame(src, dst_ip: str, ttl: int = 64) -> bytes:
    return bytes(
        Ether(src=src.mac, dst=SWITCH_MAC)
        / IP(src=src.ip, dst=dst_ip, ttl=ttl)
        / UDP(sport=1234, dport=5678)
        / Raw(b"hello")
    )


@pytest.mark.parametrize("target_ip", ["10.0.0.2", SERVICE_IP])
def test_arp_requests_are_answered_with_the_switch_mac(fabric, target_ip):
    h0 = fabric.hosts[0]
    fabric.drain()
    h0.raw.send(
        bytes(
            Ether(src=h0.mac, dst="ff:ff:ff:ff:ff:ff")
            / ARP(op=1, hwsrc=h0.mac, psrc=h0.ip, pdst=target_ip)
        )
    )
    replies = [Ether(f) for f in h0.raw.receive(2.0, count=1)]
    assert len(replies) == 1
    arp = replies[0][ARP]
    assert (arp.op, arp.hwsrc, arp.psrc, arp.hwdst, arp.pdst) == (
        2,
        SWITCH_MAC,
        target_ip,
        h0.mac,
        h0.ip,
    )
    assert replies[0][Ether].dst == h0.mac


def test_ipv4_is_routed_with_neighbor_rewrite(fabric):
    h0, h1, h2 = fabric.hosts
    fabric.drain()
    h0.raw.send(_udp_frame(h0, h1.ip))
    # h1's kernel answers with ICMP and ARPs for it: keep only our datagram.
    got = [p for p in map(Ether, h1.raw.receive(1.0)) if UDP in p and p[UDP].sport == 1234]
    assert len(got) == 1
    pkt = got[0]
    assert (pkt.src, pkt.dst) == (SWITCH_MAC, h1.mac)
    assert pkt[IP].ttl == 63 and pkt[Raw].load == b"hello"
    ip_copy = pkt[IP].copy()
    del ip_copy.chksum
    assert IP(bytes(ip_copy)).chksum == pkt[IP].chksum
    assert [p for p in map(Ether, h2.raw.receive(QUIET)) if UDP in p] == []


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (lambda h: _udp_frame(h, "192.0.2.9"), DropReason.NO_ROUTE),
        (lambda h: _udp_frame(h, "10.0.0.2", ttl=1), DropReason.TTL_EXPIRED),
        (
            lambda h: bytes(
                Ether(src=h.mac, dst=SWITCH_MAC, type=0x86DD) / Raw(b"\x60" + b"\x00" * 39)
            ),
            DropReason.UNSUPPORTED,
        ),
        (
            lambda h: bytes(
                Ether(src=h.mac, dst=SWITCH_MAC)
                / IP(src=h.ip, dst=SERVICE_IP)
                / UDP(sport=1, dport=9)
                / Raw(b"x")
            ),
            DropReason.BAD_HEADER,
        ),
        (
            lambda h: bytes(
                Ether(src=h.mac, dst=SWITCH_MAC) / ARP(op=1, psrc=h.ip, pdst="10.9.9.9")
            ),
            DropReason.NO_ROUTE,
        ),
    ],
    ids=["no-route", "ttl", "ipv6", "not-aggregation-to-service", "arp-unknown"],
)
def test_unroutable_traffic_is_dropped_by_reason(fabric, frame, reason):
    h0 = fabric.hosts[0]
    counters = CounterDelta(fabric)
    h0.raw.send(frame(h0))
    h0.raw.receive(QUIET)
    assert counters.drops() == {reason: 1}


def test_kernel_udp_between_hosts(fabric):
    """Ordinary sockets work across the switch: ARP through proxy ARP, then routing."""
    h0, h1 = fabric.hosts[0], fabric.hosts[1]
    with in_namespace(h1.namespace):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with in_namespace(h0.namespace):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((h1.ip, 7000))
        rx.settimeout(3.0)
        tx.sendto(b"through the switch", (h1.ip, 7000))
        data, peer = rx.recvfrom(100)
    assert data == b"through the switch" and peer[0] == h0.ip


@pytest.mark.parametrize("flags", [Flag.RESULT, Flag.RESULT | Flag.RETX], ids=["result", "resent"])
def test_a_routed_result_flagged_frame_is_forwarded_as_sent(fabric, flags):
    """A host's datagram to another host's port 40700 that claims to be a result of a job
    on the switch (for rank 2, on h2) is routed to h1 like any other: the egress delivers
    only the results the aggregation emitted, so it is neither rewritten to come from the
    service address nor redirected to h2, and no counter moves."""
    h0, h1, h2 = fabric.hosts
    job = Job(fabric, fabric.hosts)
    header = AggHeader(job.job_id, slot=0, shadow=0, rank=2, op=Op.ADD, chunk=0, flags=flags)
    payload = pack_payload(header, np.arange(CELLS_PER_PKT, dtype=np.int32))
    sent = FrameTemplate(h0.mac, SWITCH_MAC, h0.ip, h1.ip, AGG_UDP_PORT).frame(payload)
    fabric.drain()
    counters = CounterDelta(fabric)
    h0.raw.send(sent)
    # h1's kernel answers with ICMP (to h0) and may ARP: keep only frames to port 40700.
    got = [f for f in h1.raw.receive(2.0, count=1) if UDP in Ether(f)]
    assert len(got) == 1, "the frame did not reach the host it was addressed to"
    assert_routed_unchanged(got[0], sent, SWITCH_MAC, h1.mac)
    assert recv_frames(h2.raw.sock) == [], "delivered as a result to rank 2"
    assert counters.events() == {} and counters.drops() == {}


@pytest.mark.parametrize("to_service", [False, True], ids=["to-host", "to-service"])
def test_a_frame_from_the_service_address_is_dropped(fabric, to_service):
    """A host that claims the switch's service address as its source, e.g. to feed a worker
    forged results (UDP source port 40700, to the worker's own port), is dropped as
    WRONG_PORT: no frame from outside may come from the switch's own address."""
    h0, h1, _ = fabric.hosts
    job = Job(fabric, fabric.hosts)
    header = AggHeader(job.job_id, slot=0, shadow=0, rank=1, op=Op.ADD, chunk=0, flags=Flag.RESULT)
    payload = pack_payload(header, np.arange(CELLS_PER_PKT, dtype=np.int32))
    dst = SERVICE_IP if to_service else h1.ip
    forged = bytes(
        Ether(src=h0.mac, dst=SWITCH_MAC)
        / IP(src=SERVICE_IP, dst=dst)
        / UDP(sport=AGG_UDP_PORT, dport=AGG_UDP_PORT if to_service else 41000)
        / Raw(payload)
    )
    fabric.drain()
    counters = CounterDelta(fabric)
    h0.raw.send(forged)
    assert [f for f in h1.raw.receive(QUIET) if UDP in Ether(f)] == [], "the forgery got through"
    assert counters.drops() == {DropReason.WRONG_PORT: 1}
    assert counters.events() == {}
