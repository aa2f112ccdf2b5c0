"""The reference pipeline in-process (no root, no sockets): frames in, frames out, with the
forwarding state written over real P4Runtime by the controller's own code."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from homagg.control.aggregation import JobEntries, Worker
from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.forwarding import Host, PeerService, forwarding_entries
from homagg.control.install import install_job, reconcile
from homagg.control.switch_connection import SwitchConnection
from homagg.lab.addresses import SERVICE_IP, SWITCH_MAC, host_ip, host_mac, host_switch_port
from homagg.refswitch.pipeline import Pipeline
from homagg.refswitch.switch import ReferenceSwitch
from homagg.wire.constants import AGG_UDP_PORT, CELLS_PER_PKT, DropReason, Flag, Op
from homagg.wire.frame import FrameTemplate
from homagg.wire.header import AggHeader
from homagg.wire.packer import pack_payload
from homagg.wire.scapy_layer import Agg

HOSTS = [Host(ip=host_ip(i), mac=host_mac(i), switch_port=host_switch_port(i)) for i in range(4)]
PEER = PeerService("10.0.9.254", 4)  # another switch of the tree, behind port 4


@pytest.fixture(scope="module")
def switch():
    sw = ReferenceSwitch({}, "127.0.0.1:0")
    port = sw.start()
    conn = SwitchConnection(f"127.0.0.1:{port}")
    conn.connect()
    conn.set_pipeline(P4INFO_PATH, BMV2_JSON_PATH)
    entries = forwarding_entries(HOSTS, SERVICE_IP, SWITCH_MAC, peers=[PEER])
    reconcile(conn, entries, read_back=False)
    install_job(
        conn,
        JobEntries(
            job_id=5,
            pool_base=100,
            pool_size=4,
            mcast_grp=5,
            workers=tuple(
                Worker(rank=i, switch_port=h.switch_port, mac=h.mac, ip=h.ip, udp_port=41000 + i)
                for i, h in enumerate(HOSTS[:3])
            ),
        ),
    )
    yield sw, conn
    conn.close()
    sw.close()


def agg_frame(rank: int, cells: np.ndarray, **kw) -> bytes:
    h = HOSTS[rank]
    fields = dict(job_id=5, slot=0, shadow=0, rank=rank, op=Op.ADD, chunk=1) | kw
    return FrameTemplate(h.mac, SWITCH_MAC, h.ip, SERVICE_IP, 41000 + rank).frame(
        pack_payload(AggHeader(**fields), cells)
    )


def drops(conn) -> dict[int, int]:
    return {i: pk for i, (pk, _) in conn.read_counter("SwitchIngress.drop_counter").items() if pk}


def test_round_multicasts_the_sum_as_unicast_datagrams(switch):
    sw, _ = switch
    pipe = Pipeline(sw.device)
    parts = [np.full(CELLS_PER_PKT, 10 * (r + 1), np.int32) for r in range(3)]
    assert pipe.process(1, agg_frame(0, parts[0], chunk=11)) == []
    assert pipe.process(2, agg_frame(1, parts[1], chunk=11)) == []
    out = pipe.process(3, agg_frame(2, parts[2], chunk=11))
    assert sorted(port for port, _ in out) == [1, 2, 3]
    for port, frame in out:
        pkt = Ether(frame)
        rank = port - 1
        assert pkt[Ether].dst == HOSTS[rank].mac and pkt[IP].dst == HOSTS[rank].ip
        assert pkt[IP].src == SERVICE_IP and pkt[UDP].sport == AGG_UDP_PORT
        assert pkt[UDP].dport == 41000 + rank and pkt[Agg].rank == rank
        assert pkt[Agg].flags == Flag.RESULT and pkt[Agg].cells == [60] * CELLS_PER_PKT


def test_truncated_and_unknown_job_are_counted(switch):
    sw, conn = switch
    pipe = Pipeline(sw.device)
    before = drops(conn)
    cells = np.zeros(CELLS_PER_PKT, np.int32)
    assert pipe.process(1, agg_frame(0, cells)[:100]) == []
    assert pipe.process(1, agg_frame(0, cells, job_id=9)) == []
    after = drops(conn)
    assert after.get(DropReason.TRUNCATED, 0) - before.get(DropReason.TRUNCATED, 0) == 1
    assert after.get(DropReason.UNKNOWN_JOB, 0) - before.get(DropReason.UNKNOWN_JOB, 0) == 1


def test_arp_and_routing(switch):
    sw, _ = switch
    pipe = Pipeline(sw.device)
    h0, h1 = HOSTS[0], HOSTS[1]
    [(port, frame)] = pipe.process(
        1,
        bytes(
            Ether(src=h0.mac, dst="ff:ff:ff:ff:ff:ff")
            / ARP(op=1, hwsrc=h0.mac, psrc=h0.ip, pdst=SERVICE_IP)
        ),
    )
    assert port == 1 and Ether(frame)[ARP].hwsrc == SWITCH_MAC
    [(port, frame)] = pipe.process(
        1, bytes(Ether(src=h0.mac, dst=SWITCH_MAC) / IP(src=h0.ip, dst=h1.ip, ttl=9) / UDP() / b"x")
    )
    assert port == 2 and Ether(frame)[IP].ttl == 8 and Ether(frame).dst == h1.mac


def test_service_sources_come_in_only_toward_their_switch(switch):
    """service_source: the own service address never, a peer's only on the port toward it;
    both are WRONG_PORT drops, any other source is routed."""
    sw, conn = switch
    pipe = Pipeline(sw.device)
    h1 = HOSTS[1]

    def datagram(src: str) -> bytes:
        return bytes(Ether(src=HOSTS[0].mac, dst=SWITCH_MAC) / IP(src=src, dst=h1.ip) / UDP())

    before = drops(conn).get(DropReason.WRONG_PORT, 0)
    assert [p for p, _ in pipe.process(PEER.port, datagram(PEER.ip))] == [h1.switch_port]
    assert pipe.process(1, datagram(PEER.ip)) == []
    assert pipe.process(PEER.port, datagram(SERVICE_IP)) == []
    assert pipe.process(1, datagram(SERVICE_IP)) == []
    assert drops(conn).get(DropReason.WRONG_PORT, 0) - before == 3


def test_pipeline_push_resets_registers(switch):
    """A new pipeline starts with empty slots, as BMv2 does after SetForwardingPipelineConfig."""
    sw, _ = switch
    pipe = Pipeline(sw.device)
    pipe.registers.seen[7] = 1
    sw.device.config_generation += 1
    pipe.process(1, b"\x00" * 20)
    assert pipe.registers.seen[7] == 0


def test_fuzzed_packets_never_crash_and_are_all_accounted_for(switch):
    """10,000 mutated frames: each is dropped under a reason, absorbed as a contribution,
    answered, or forwarded; nothing raises; a clean round afterwards is still exact."""
    sw, _ = switch
    pipe = Pipeline(sw.device)
    rng = np.random.default_rng(2024)
    drops = sw.device.counter("SwitchIngress.drop_counter")
    egress_drops = sw.device.counter("SwitchEgress.drop_counter")
    events = sw.device.counter("SwitchIngress.aggregation.event_counter")

    def tally() -> int:
        return sum(drops.read(i)[0] + egress_drops.read(i)[0] for i in range(16)) + sum(
            events.read(i)[0] for i in (0, 2)
        )

    base = agg_frame(0, np.arange(CELLS_PER_PKT, dtype=np.int32), chunk=500)
    unexplained = 0
    for n in range(10_000):
        frame = bytearray(base)
        kind = n % 4
        if kind == 0:  # flip random bytes anywhere
            for pos in rng.integers(0, len(frame), 4):
                frame[pos] = int(rng.integers(0, 256))
        elif kind == 1:  # random header fields, from a random rank's port
            frame[42:58] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        elif kind == 2:  # truncated or oversized
            frame = frame[: int(rng.integers(0, len(frame)))] if n % 8 else frame + bytes(40)
        else:  # garbage of random length
            frame = bytearray(
                rng.integers(0, 256, int(rng.integers(1, 1600)), dtype=np.uint8).tobytes()
            )
        before = tally()
        out = pipe.process(int(rng.integers(1, 5)), bytes(frame))
        if tally() == before and not out:
            unexplained += 1
    assert unexplained == 0, f"{unexplained} frames vanished without a counter"
    parts = [np.full(CELLS_PER_PKT, r + 1, np.int32) for r in range(3)]
    outs = [pipe.process(r + 1, agg_frame(r, parts[r], chunk=900, slot=3)) for r in range(3)]
    assert [len(o) for o in outs] == [0, 0, 3]
    for _, frame in outs[2]:
        assert Ether(frame)[Agg].cells == [6] * CELLS_PER_PKT
