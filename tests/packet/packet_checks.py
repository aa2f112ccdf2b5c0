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
