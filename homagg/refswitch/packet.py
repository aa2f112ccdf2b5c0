"""Headers, metadata and standard metadata of one packet in the reference pipeline,
field for field as declared in p4src/include/headers.p4 and v1model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from homagg.wire.constants import DROP_PORT  # v1model: mark_to_drop sets egress_spec to it

# The headers' wire layouts: homagg.wire.frame (Ethernet .. UDP), homagg.wire.header.HEADER_STRUCT
# (agg_h) and homagg.wire.packer.CELLS_DTYPE (the cells).


@dataclass(slots=True)
class Ethernet:
    dst_addr: int
    src_addr: int
    ether_type: int


@dataclass(slots=True)
class Arp:
    htype: int
    ptype: int
    hlen: int
    plen: int
    oper: int
    sha: int
    spa: int
    tha: int
    tpa: int


@dataclass(slots=True)
class Ipv4:
    version: int
    ihl: int
    diffserv: int
    total_len: int
    identification: int
    flags: int
    frag_offset: int
    ttl: int
    protocol: int
    hdr_checksum: int
    src_addr: int
    dst_addr: int


@dataclass(slots=True)
class Udp:
    src_port: int
    dst_port: int
    length: int
    checksum: int


@dataclass(slots=True)
class AggH:
    """agg_h: the fields of homagg.wire.header.AGG_HEADER_FIELDS, in wire order (tested)."""

    version: int
    flags: int
    op: int
    rank: int
    job_id: int
    slot: int
    shadow: int
    exp: int
    ncells: int
    chunk: int


@dataclass(slots=True)
class Headers:
    """headers_t: None stands for an invalid header; payload is what the parser left."""

    ethernet: Ethernet | None = None
    arp: Arp | None = None
    ipv4: Ipv4 | None = None
    udp: Udp | None = None
    agg: AggH | None = None
    cells: np.ndarray | None = None  # int32 (CELLS_PER_PKT,)
    payload: bytes = b""

    def clone(self) -> Headers:
        """A deep copy, as the replication engine makes for each multicast replica."""
        return Headers(
            ethernet=None if self.ethernet is None else dup(self.ethernet),
            arp=None if self.arp is None else dup(self.arp),
            ipv4=None if self.ipv4 is None else dup(self.ipv4),
            udp=None if self.udp is None else dup(self.udp),
            agg=None if self.agg is None else dup(self.agg),
            cells=None if self.cells is None else self.cells.copy(),
            payload=self.payload,
        )


@dataclass(slots=True)
class Metadata:
    """metadata_t."""

    drop_reason: int = 0
    to_aggregation: int = 0
    absorbed: int = 0
    to_delivery: int = 0  # a result the aggregation emitted: the egress delivers it
    pool_base: int = 0
    pool_size: int = 0
    num_workers: int = 0
    mcast_grp: int = 0
    worker_port: int = 0
    worker_bit: int = 0
    slot_index: int = 0
    verdict: int = 0
    count: int = 0
    has_uplink: int = 0
    uplink_port: int = 0
    uplink_rank: int = 0
    parent_ip: int = 0
    parent_mac: int = 0


@dataclass(slots=True)
class StandardMetadata:
    """The v1model standard_metadata fields the program uses."""

    ingress_port: int
    packet_length: int
    egress_spec: int = 0
    egress_port: int = 0
    egress_rid: int = 0
    mcast_grp: int = 0
    parser_error: str = "NoError"


def dup(obj):
    """A shallow copy of a slotted dataclass (copy.copy costs several times more per packet)."""
    return type(obj)(*(getattr(obj, name) for name in obj.__slots__))


def mark_to_drop(std: StandardMetadata) -> None:
    """v1model mark_to_drop: drop port, no multicast."""
    std.egress_spec = DROP_PORT
    std.mcast_grp = 0
