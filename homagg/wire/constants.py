"""Wire constants of the aggregation protocol; p4src/include/constants.p4 is the source,
and tests/wire/test_constants.py checks that the two agree."""

import os
from enum import IntEnum

from homagg.environment import CELLS_PER_PKT_ENV

# Cells per packet a program can be built for: the v1model program's 64, 128 or 256
# (`make p4 CELLS=...`), the TNA program's 16, 32, 48 or 64 (`make p4-tofino TNA_CELLS=...`).
CELLS_CHOICES = (16, 32, 48, 64, 128, 256)
# The committed v1model build's (256); the reference switch and the tests use it. The
# environment variable serves benchmarks that run a program built otherwise. A worker
# takes its job's value from the assignment (the controller's per-switch cells_per_packet).
CELLS_PER_PKT = int(os.environ.get(CELLS_PER_PKT_ENV, "256"))
if CELLS_PER_PKT not in CELLS_CHOICES:
    raise ValueError(f"{CELLS_PER_PKT_ENV} must be one of {CELLS_CHOICES}, not {CELLS_PER_PKT}")
AGG_UDP_PORT = 40700
AGG_VERSION = 1
AGG_HEADER_BYTES = 16  # homagg/wire/header.py checks that its fields add up to this
# The headers before it (homagg/wire/frame.py checks its layouts have these sizes); IPv4
# without options, the only kind the switch aggregates.
ETH_HEADER_BYTES = 14
IPV4_HEADER_BYTES = 20
UDP_HEADER_BYTES = 8


def agg_udp_length(cells_per_packet: int) -> int:
    """The UDP length of an aggregation packet of that many cells (UDP header included)."""
    return UDP_HEADER_BYTES + AGG_HEADER_BYTES + 4 * cells_per_packet


def agg_frame_bytes(cells_per_packet: int) -> int:
    """The Ethernet frame of an aggregation packet (no FCS): what it costs on the wire."""
    return ETH_HEADER_BYTES + IPV4_HEADER_BYTES + agg_udp_length(cells_per_packet)


AGG_UDP_LENGTH = agg_udp_length(CELLS_PER_PKT)
AGG_IPV4_LENGTH = IPV4_HEADER_BYTES + AGG_UDP_LENGTH
AGG_FRAME_BYTES = agg_frame_bytes(CELLS_PER_PKT)
NUM_SLOTS = 4096
SHADOW_BITS = 1  # the header's shadow chooses one of a slot's copies (shadow sets)
SHADOW_COPIES = 1 << SHADOW_BITS
NUM_SLOT_COPIES = SHADOW_COPIES * NUM_SLOTS
MAX_WORKERS_PER_JOB = 32  # one bit each in the slot's 32-bit seen bitmap
RANK_BITS = 8  # the header's rank
MAX_RANKS = 1 << RANK_BITS  # ranks of a job spanning a tree of switches (32 per switch)
# The slot state's count field: its top bit marks a leaf's copy final (the parent's result
# is stored in it), the low bits count the contributions (two-level aggregation).
SLOT_FINAL = 0x80
SLOT_COUNT_MASK = 0x7F
RESULT_TTL = 64  # the TTL the switch gives a result it sends

# Codes of the headers around the aggregation header that the switch matches on.
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_ARP = 0x0806
IP_PROTO_UDP = 17
ARP_HTYPE_ETHERNET = 1
ARP_OPER_REQUEST = 1
ARP_OPER_REPLY = 2

# Widths of the header fields that other code computes with (P4: job_id_t, chunk_t).
JOB_ID_BITS = 16
MAX_JOB_ID = (1 << JOB_ID_BITS) - 1  # job ids are 1..MAX_JOB_ID; 0 is never assigned
CHUNK_BITS = 32
# Chunk numbers are serial numbers modulo 2^32 (RFC 1982): they wrap, and the switch
# orders two of them by their difference masked to 32 bits.
CHUNK_MODULUS = 1 << CHUNK_BITS
CHUNK_MASK = CHUNK_MODULUS - 1
# Cells are int32 lanes; a sum wraps in two's complement, i.e. modulo 2^32.
CELL_BITS = 32
CELL_MASK = (1 << CELL_BITS) - 1

# Switch ports (P4: port_t). v1model's port_t is bit<9>, and mark_to_drop sends a packet
# to the highest port (BMv2's default drop port), so no host can be on that one.
PORT_BITS = 9
DROP_PORT = (1 << PORT_BITS) - 1  # 511
MAX_SWITCH_PORT = DROP_PORT - 1  # the highest port a host (or a -i PORT@IFACE) can use

# UDP and TCP port numbers are 16 bits; 0 is no port.
MAX_L4_PORT = (1 << 16) - 1
# Not in the P4 program (each worker's port is in its entry): the UDP port of a node's
# first rank by convention; rank r on a node uses WORKER_UDP_BASE + its local rank.
WORKER_UDP_BASE = 41000


class Flag(IntEnum):
    """Bits of the header's flags byte."""

    RESULT = 0x01
    RETX = 0x02


class Op(IntEnum):
    """How the switch combines the cells of a slot (and the exponent is always MAX)."""

    ADD = 1
    OR = 2
    MAX = 3
    ADD16 = 4  # each int32 cell holds 2 int16 lanes, each lane wraps on its own
    ADD8 = 5  # each int32 cell holds 4 int8 lanes, each lane wraps on its own


# Lane width in bits of each adding op (homagg/wire/lanes.py).
LANE_BITS_OF_OP = {Op.ADD: 32, Op.ADD16: 16, Op.ADD8: 8}


class DropReason(IntEnum):
    """Index of the drop_counter cell counting packets dropped for that reason."""

    NONE = 0
    TRUNCATED = 1
    BAD_HEADER = 2
    BAD_LENGTH = 3
    BAD_OP = 4
    UNKNOWN_JOB = 5
    BAD_RANK = 6
    WRONG_PORT = 7
    SLOT_OUT_OF_POOL = 8
    DUPLICATE = 9
    STALE = 10
    NO_ROUTE = 11
    TTL_EXPIRED = 12
    UNSUPPORTED = 13
    NO_RECIPIENT = 14
    # Frames lost before the pipeline: the reference switch counts its sockets' kernel drops
    # here (ingress drop_counter); the P4 program never sets it (BMv2 cannot see such loss).
    KERNEL_RX_OVERFLOW = 15


NUM_DROP_REASONS = 16


class Event(IntEnum):
    """Index of the event_counter cell."""

    CONTRIBUTION = 0
    RESULT = 1
    RESENT = 2
    PARTIAL = 3  # a leaf's partial sum sent up to its parent (first send or re-send)


NUM_EVENTS = 4
