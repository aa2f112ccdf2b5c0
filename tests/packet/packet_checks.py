"""Assertions shared by the packet tests."""

from __future__ import annotations

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from homagg.lab.aggjob import WORKER_UDP_BASE, RankTraffic
from homagg.wire.scapy_layer import Agg


def assert_result_frame(pkt: Ether, job: RankTraffic, rank: int) -> None:
    """A result must be a plain unicast datagram from the service address to the rank."""
    host, switch = job.hosts[rank], job.fabric_of(rank)
    assert pkt[Ether].dst == host.mac and pkt[Ether].src == switch.switch_mac
    assert pkt[IP].src == switch.service_ip and pkt[IP].dst == host.ip
    assert pkt[UDP].dport == WORKER_UDP_BASE + rank and pkt[UDP].chksum == 0
    ip_copy = pkt[IP].copy()
    del ip_copy.chksum
    assert IP(bytes(ip_copy))[IP].chksum == pkt[IP].chksum, "IPv4 checksum not recomputed"
    assert pkt[Agg].job_id == job.job_id and pkt[Agg].rank == rank


def assert_routed_unchanged(got: bytes, sent: bytes, switch_mac: str, next_mac: str) -> None:
    """`got` is `sent` as a route forwards it: the route's MACs, the TTL one lower and the
    IPv4 checksum recomputed; addresses, UDP header, aggregation header and cells as sent."""
    eth = Ether(got)
    assert (eth.src, eth.dst) == (switch_mac, next_mac)
    ip = IP(sent[14:34])
    ip.ttl -= 1
    del ip.chksum
    assert got[14:34] == bytes(ip), "IPv4 header: only the TTL and its checksum may change"
    assert got[34:] == sent[34:], "UDP header, aggregation header or cells rewritten"
