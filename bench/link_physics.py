"""What the links allow an aggregation of n float32 elements per worker when every link runs
at a rate: the switch sends one copy of the gradient per worker (in aggregation packets,
headers included) and gets one copy back; gloo's ring all_reduce sends 2(W-1)/W of it
(reduce-scatter, then all-gather) in TCP segments. Bytes as the shaper counts them:
Ethernet frames without preamble, FCS or gap (htb on veth counts the frame's length)."""

from __future__ import annotations

from dataclasses import dataclass

from homagg.wire.constants import CELLS_PER_PKT, agg_frame_bytes

CELL_BYTES = 4  # one 32-bit cell: a fixed-point element
ELEMENT_BYTES = 4  # float32 gradient element
MTU = 1500
# Ethernet 14 + IPv4 20 + TCP 20 + the timestamp option 12 (Linux sends it by default)
TCP_FRAME_OVERHEAD = 14 + 20 + 20 + 12
TCP_PAYLOAD = MTU - (20 + 20 + 12)  # the MSS of a segment with timestamps


def switch_wire_share(cells_per_packet: int = CELLS_PER_PKT) -> float:
    """The share of an aggregation frame that is gradient (cells): payload / frame."""
    return CELL_BYTES * cells_per_packet / agg_frame_bytes(cells_per_packet)


def switch_header_bytes(cells_per_packet: int = CELLS_PER_PKT) -> int:
    """Bytes of headers per aggregation packet (Ethernet, IPv4, UDP, the aggregation
    header): the frame minus its cells."""
    return agg_frame_bytes(cells_per_packet) - CELL_BYTES * cells_per_packet


def tcp_wire_share() -> float:
    """The share of a full TCP segment's frame that is payload."""
    return TCP_PAYLOAD / (TCP_PAYLOAD + TCP_FRAME_OVERHEAD)


def ring_fraction(world_size: int) -> float:
    """The gradient's share a ring all_reduce sends (and receives) per worker: 2(W-1)/W."""
    if world_size < 1:
        raise ValueError(f"a world of {world_size} ranks")
    return 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class LinkBound:
    """The ideal times (s) of one aggregation at a link rate, and what follows from them."""

    n: int
    world_size: int
    mbit: float
    switch_s: float
    ring_s: float

    @property
    def ratio(self) -> float:
        """The switch's ideal speed-up over the ring: ring time / switch time."""
        return self.ring_s / self.switch_s

    @property
    def switch_goodput_share(self) -> float:
        """The switch's ideal goodput (gradient bytes/s per worker) as a share of the rate."""
        return self.n * ELEMENT_BYTES * 8 / self.switch_s / (self.mbit * 1e6)


def link_bound(
    n: int,
    world_size: int,
    mbit: float,
    cells_per_packet: int = CELLS_PER_PKT,
    switch_packets: int = 0,
) -> LinkBound:
    """Ideal times of n elements per worker on links of `mbit` Mbit/s (each direction:
    what a worker sends is the bound, its results come back on the other direction);
    `switch_packets`: the packets a worker really sends for it (a codec's other phases
    included), else one copy of the gradient in full packets."""
    if n < 1 or mbit <= 0:
        raise ValueError(f"need n >= 1 and a positive rate, not n={n}, {mbit} Mbit/s")
    rate = mbit * 1e6 / 8  # bytes/s
    grad = n * ELEMENT_BYTES
    packets = switch_packets or -(-n // cells_per_packet)
    switch_s = packets * agg_frame_bytes(cells_per_packet) / rate
    ring_s = ring_fraction(world_size) * grad / tcp_wire_share() / rate
    return LinkBound(n, world_size, mbit, switch_s, ring_s)


def cpu_bound_mbit(packets_per_s: float, cells_per_packet: int = CELLS_PER_PKT) -> float:
    """The goodput (gradient Mbit/s per worker) a worker packet rate allows."""
    return packets_per_s * CELL_BYTES * cells_per_packet * 8 / 1e6
