/* Headers and metadata of the TNA program. The wire headers (Ethernet to agg_h) and every
 * constant come from ../include, shared with the v1model program; the cells are one
 * bit<32> field each, and a harvest header rides in front of a packet the program
 * recirculates to read the rest of a result (docs/tofino.md). */
#ifndef HOMAGG_TNA_HEADERS_P4
#define HOMAGG_TNA_HEADERS_P4

#include "cells.p4"
#include "../include/headers.p4"

/* Ports as the control plane sees them: behind Stratum, P4Runtime carries its SDN port
 * numbers (32 bits) and the switch translates them to the chip's, as for multicast
 * replicas. */
@p4runtime_translation("tna/PortId_t", 32)
type bit<9> sdn_port_t;

/* The pipe-local recirculation port (its low 7 bits; the pipe's bits come from the
 * ingress port, so a result is read back in the pipe whose registers hold it): 68 on
 * Tofino 1. A build option for other chips or a front-panel port in loopback. */
#ifndef RECIRC_PORT
#define RECIRC_PORT 68
#endif
const bit<7> RECIRC_PORT_LOW = RECIRC_PORT;

#define CELL_FIELDS(p, a, b) bit<32> c##a; bit<32> c##b;
header cells_h {
    FOR_EACH_PAIR(CELL_FIELDS)
}

/* What a recirculated pass needs from the pass before it: which half of the pairs to
 * read (step), and where the result goes. Never leaves the switch. */
header harvest_h {
    bit<8>  step;       /* HARVEST_* below */
    bit<8>  send_to;    /* SEND_TO_* below */
    bit<16> slot_sum;   /* pool_base + slot: with agg_h.shadow, the slot copy */
    bit<16> mcast_grp;
    bit<7>  pad;
    PortId_t port;      /* the worker's port, for a resend */
}

/* Harvest steps: which register action reads the half the pass before did not. */
const bit<8> HARVEST_LO_LAST = 16;  /* read the lo cells (MAX with neutral input), deliver */
const bit<8> HARVEST_HI_LAST = 17;  /* read the hi cells (OR with neutral input), deliver */
const bit<8> HARVEST_LO_MORE = 18;  /* read the lo cells, then HARVEST_HI_LAST */
/* Where the pass that has read the whole result sends it (harvest_h.send_to): the
 * v1model program's to_group, to_sender and to_parent (flags 0, or RETX for a re-send). */
const bit<8> SEND_TO_GROUP = 0;
const bit<8> SEND_TO_SENDER = 1;
const bit<8> SEND_TO_PARENT = 2;
const bit<8> SEND_TO_PARENT_RETX = 3;
/* A result from the parent at a leaf (two-level aggregation). Its first pass checks it:
 * slot_round answers whether the copy holds its round, seen_table makes that the phase
 * PARENT_RESULT, and slot_count returns the copy's count and, when it is num_workers (the
 * copy complete, not final), makes the copy final with the result's exponent. An accepted
 * result is recirculated once: that pass (HARVEST_STORE) stores the cells it carries and
 * sends it to the job's group. */
const bit<8> HARVEST_STORE = 19;
const bit<8> PARENT_RESULT = 20;
/* Neutral inputs: MAX with INT32_MIN and OR with 0 leave a register word as it is. */
const bit<32> NEUTRAL_MAX = 0x80000000;
const bit<32> NEUTRAL_OR = 0;

/* The v1model program's meta.to_delivery, carried from the ingress to the egress in front
 * of Ethernet (TNA keeps no ingress metadata for the egress): 1 for the results the
 * aggregation emitted, the only packets the egress delivers. On every packet that goes
 * through the egress; never on a recirculated one. */
header bridge_h {
    bit<7> pad;
    bit<1> to_delivery;
}

struct ingress_headers_t {
    bridge_h   bridge;
    harvest_h  harvest;
    ethernet_h ethernet;
    arp_h      arp;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
    cells_h    cells;
}

/* The slot state of the v1model program (one 96-bit entry) is split into registers that
 * each take one stateful-ALU access per packet (docs/tofino.md). */
typedef bit<13> slot_copy_t;  /* shadow * NUM_SLOTS + pool_base + slot */

struct ingress_metadata_t {
    bit<8>   fwd_drop;      /* forwarding's drop reason */
    /* service_source's verdict, nonzero to drop: from a peer's service address, the port
     * toward the peer XOR the ingress port; from this switch's own, all ones. */
    bit<9>   source_port_diff;
    bit<8>   hdr_drop;      /* the aggregation header's checks */
    bit<1>   to_aggregation;
    bit<1>   job_miss;
    bit<1>   rank_miss;
    bit<1>   slot_high;     /* slot >= NUM_SLOTS */
    bit<1>   admitted;      /* passed every check: the slot state is touched */
    bit<1>   absorbed;
    bit<1>   to_delivery;   /* a result the aggregation emitted: the egress delivers it */
    bit<1>   has_event;
    bit<2>   event;
    bit<8>   drop_reason;
    bit<16>  slot_sum;      /* pool_base + slot (both below 2^12 when admitted) */
    bit<4>   base_high;     /* pool_base's bits above NUM_SLOTS: 0 when admitted */
    bit<16>  room;          /* pool_size - slot: 1..2^15-1 when the slot is in the pool */
    bit<8>   num_workers;
    bit<8>   final_count;   /* num_workers | SLOT_FINAL: the count of a final copy (set
                             * by the admission: in set_job it costs a stage) */
    bit<8>   accept_count;  /* num_workers for a result from the parent, else 0: the
                             * count at which slot_count makes a copy final */
    bit<16>  mcast_grp;
    bit<9>   port_diff;     /* the worker's configured port XOR the ingress port (all
                             * ones for an unknown rank) */
    bit<32>  worker_bit;
    bit<8>   fresh;         /* 1: another job's slot copy, or a newer chunk (slot_round);
                             * for a result from the parent: 1 when the copy holds its round */
    bit<8>   stale;         /* 1: this job's slot copy, an older chunk (slot_round_twin) */
    bit<32>  seen_before;   /* the slot copy's seen bitmap before this packet & worker_bit */
    bit<8>   phase;         /* VERDICT_* of this pass, or the HARVEST_* step of a read */
    bit<8>   count;         /* contributions in the round, after this packet's */
    /* From the job's uplink entry (a leaf of a two-level job): where partials go up, and
     * the checks of a result from the parent (its port and rank, XOR the packet's; the
     * port's all ones without an entry). */
    bit<1>   has_uplink;
    PortId_t uplink_port;
    bit<9>   uplink_port_diff;
    bit<8>   uplink_rank;
    bit<8>   uplink_rank_diff;
    ipv4_addr_t parent_ip;
    mac_addr_t  parent_mac;
}

/* Egress parses no cells: they pass through as payload (Tofino's PHV is shared by the
 * ingress and egress threads, so cells parsed twice would halve what fits). */
struct egress_headers_t {
    bridge_h   bridge;      /* invalidated by the egress: never leaves the switch */
    ethernet_h ethernet;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
}

struct egress_metadata_t {
    bit<8> drop_reason;
}

#endif
