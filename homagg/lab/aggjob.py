"""A job installed on a fabric: frames from its ranks, results back, counters read."""

from __future__ import annotations

import itertools
import socket
import time

import numpy as np
from scapy.layers.l2 import Ether

from homagg.control.aggregation import JobEntries, Worker
from homagg.control.delivery import mcast_grp_of_job
from homagg.control.install import install_job
from homagg.lab.fabric import Fabric, FabricHost
from homagg.lab.namespace import in_namespace
from homagg.wire import p4names
from homagg.wire.constants import (
    AGG_UDP_PORT,
    CELL_MASK,
    CELLS_PER_PKT,
    ETH_HEADER_BYTES,
    ETHERTYPE_IPV4,
    IP_PROTO_UDP,
    IPV4_HEADER_BYTES,
    NUM_SLOTS,
    UDP_HEADER_BYTES,
    WORKER_UDP_BASE,
    DropReason,
    Event,
    Op,
    agg_udp_length,
)
from homagg.wire.frame import (
    ETH_STRUCT,
    IPV4_IHL,
    IPV4_STRUCT,
    IPV4_VERSION,
    UDP_STRUCT,
    FrameTemplate,
)
from homagg.wire.header import AggHeader
from homagg.wire.packer import PAYLOAD_BYTES, pack_payload, parse_payload
from homagg.wire.scapy_layer import Agg
from homagg.worker.transport.channel import UdpChannel

_job_ids = itertools.count(1)
# Slots between the pools of two consecutive jobs: pools up to this size never overlap.
POOL_STRIDE = 64


def next_job_id() -> int:
    """A job id no other job of this process had (every fabric's jobs draw from one count)."""
    return next(_job_ids)


def pool_base_of(job_id: int) -> int:
    """The first slot of a job's pool: pools of different jobs never overlap within a
    module's switch (pools up to POOL_STRIDE slots)."""
    return (job_id * POOL_STRIDE) % (NUM_SLOTS - POOL_STRIDE)


class RankTraffic:
    """The frames a job's ranks send and the results they get: rank r lives on hosts[r]
    and sends through templates[r] (set by the subclass, which installs the job)."""

    job_id: int
    hosts: list[FabricHost]
    templates: list[FrameTemplate]
    pool_size: int  # slots per switch (a rank's channel holds this many results)

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    def fabric_of(self, rank: int) -> Fabric:
        """The switch (fabric) rank `rank` sends to and gets results from."""
        raise NotImplementedError

    def frame(
        self,
        sender: int,
        cells: np.ndarray,
        slot: int = 0,
        shadow: int = 0,
        chunk: int = 0,
        op: int = Op.ADD,
        exp: int = 0,
        **fields: int,
    ) -> bytes:
        """The frame rank `sender` would send (fields override header fields, e.g. job_id, rank)."""
        header = AggHeader(
            job_id=fields.pop("job_id", self.job_id),
            slot=slot,
            shadow=shadow,
            rank=fields.pop("rank", sender),
            op=op,
            chunk=chunk,
            exp=exp,
            **fields,
        )
        return self.templates[sender].frame(pack_payload(header, np.asarray(cells, np.int32)))

    def channel(self, rank: int) -> UdpChannel:
        """Rank `rank`'s UDP channel to the switch: a socket made in its host's namespace
        (which needs enable_ip_stack), bound to the rank's address and port, its receive
        buffer sized for the job's pool as a worker's agent sizes it. It sends to its own
        switch (the job's, or its leaf in a tree)."""
        h = self.hosts[rank]
        with in_namespace(h.namespace):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((h.ip, WORKER_UDP_BASE + rank))
        channel = UdpChannel(sock, (self.fabric_of(rank).service_ip, AGG_UDP_PORT))
        channel.hold_results(self.pool_size, agg_udp_length(CELLS_PER_PKT))
        return channel

    def send(self, rank: int, cells: np.ndarray, via: FabricHost | None = None, **kw: int) -> bytes:
        """Send rank's contribution (from its own host unless via is given)."""
        frame = self.frame(rank, cells, **kw)
        (via or self.hosts[rank]).raw.send(frame)
        return frame

    def collect(
        self, ranks: list[int] | None = None, per_rank: int = 1, timeout: float = 3.0
    ) -> dict[int, list[Ether]]:
        """Frames arriving at the hosts of `ranks` (all ranks by default) within `timeout`
        seconds of the call, parsed by Scapy. One deadline for every host: their sockets
        queue frames meanwhile, so a wait for nothing costs `timeout` once, not per host."""
        deadline = time.monotonic() + timeout
        out: dict[int, list[Ether]] = {}
        for r in range(self.world_size) if ranks is None else ranks:
            left = max(0.0, deadline - time.monotonic())
            frames = self.hosts[r].raw.receive(left, count=per_rank)
            out[r] = [Ether(f) for f in frames]
        return out


class Job(RankTraffic):
    """A job over some of the fabric's hosts: rank r lives on hosts[r]."""

    def __init__(self, fabric: Fabric, hosts: list[FabricHost], pool_size: int = 16) -> None:
        self.fabric = fabric
        self.hosts = hosts
        self.pool_size = pool_size
        self.job_id = next_job_id()
        self.entries = JobEntries(
            job_id=self.job_id,
            pool_base=pool_base_of(self.job_id),
            pool_size=pool_size,
            mcast_grp=mcast_grp_of_job(self.job_id),
            workers=tuple(
                Worker(
                    rank=r,
                    switch_port=h.switch_port,
                    mac=h.mac,
                    ip=h.ip,
                    udp_port=WORKER_UDP_BASE + r,
                )
                for r, h in enumerate(hosts)
            ),
        )
        install_job(fabric.conn, self.entries)
        self.templates = [
            FrameTemplate(h.mac, fabric.switch_mac, h.ip, fabric.service_ip, WORKER_UDP_BASE + r)
            for r, h in enumerate(hosts)
        ]

    def fabric_of(self, rank: int) -> Fabric:
        """Every rank's switch is the job's fabric."""
        return self.fabric


def random_cells(
    rng: np.random.Generator, low: int = -(1 << 24), high: int = 1 << 24
) -> np.ndarray:
    """One packet's worth of random int32 cells."""
    return rng.integers(low, high, CELLS_PER_PKT, dtype=np.int64).astype(np.int32)


def wrapped_sum(parts: list[np.ndarray]) -> np.ndarray:
    """The int32 sum with two's-complement wrap, as the switch computes it."""
    total = np.sum(np.stack(parts).astype(np.int64), axis=0) & CELL_MASK
    return total.astype(np.uint32).view(np.int32)


def result_cells(pkt: Ether) -> np.ndarray:
    """The cells of a result frame."""
    return np.array(pkt[Agg].cells, np.int32)


_IPV4_AT = ETH_HEADER_BYTES
_UDP_AT = _IPV4_AT + IPV4_HEADER_BYTES
_PAYLOAD_AT = _UDP_AT + UDP_HEADER_BYTES


def agg_frame(raw: bytes) -> tuple[AggHeader, np.ndarray] | None:
    """The aggregation header and cells of an Ethernet/IPv4 (no options)/UDP frame to or
    from AGG_UDP_PORT, None for any other frame: what Ether(raw)[Agg] reads, in microseconds
    where Scapy takes a millisecond (floods parse tens of thousands of results)."""
    if len(raw) < _PAYLOAD_AT + PAYLOAD_BYTES or ETH_STRUCT.unpack_from(raw)[2] != ETHERTYPE_IPV4:
        return None
    ip = IPV4_STRUCT.unpack_from(raw, _IPV4_AT)
    sport, dport = UDP_STRUCT.unpack_from(raw, _UDP_AT)[:2]
    if ip[0] != (IPV4_VERSION << 4 | IPV4_IHL) or ip[6] != IP_PROTO_UDP:
        return None
    if AGG_UDP_PORT not in (sport, dport):
        return None
    return parse_payload(raw[_PAYLOAD_AT : _PAYLOAD_AT + PAYLOAD_BYTES])


DROP_COUNTERS = (p4names.INGRESS_DROPS, p4names.EGRESS_DROPS)
COUNTERS = (*DROP_COUNTERS, p4names.EVENT_COUNTER)


class CounterDelta:
    """Drop and event counters read over P4Runtime, relative to when it was made."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.base = self._read()

    def _read(self, names: tuple[str, ...] = COUNTERS) -> dict[str, dict[int, int]]:
        conn = self.fabric.conn
        return {name: {i: pk for i, (pk, _) in conn.read_counter(name).items()} for name in names}

    def drops(self) -> dict[DropReason, int]:
        """Packets dropped per reason since creation (ingress and egress), zeros left out."""
        now = self._read(DROP_COUNTERS)  # a poll reads no more than it needs (BMv2 is slow)
        out: dict[DropReason, int] = {}
        for name in DROP_COUNTERS:
            for i, v in now[name].items():
                d = v - self.base[name].get(i, 0)
                if d:
                    out[DropReason(i)] = out.get(DropReason(i), 0) + d
        return out

    def events(self) -> dict[Event, int]:
        """Aggregation events since creation, zeros left out."""
        now = self._read((p4names.EVENT_COUNTER,))[p4names.EVENT_COUNTER]
        base = self.base[p4names.EVENT_COUNTER]
        return {
            Event(i): v - base.get(i, 0)
            for i, v in now.items()
            if i < len(Event) and v - base.get(i, 0)
        }
