/* Headers and metadata of the TNA program. The wire headers (Ethernet to agg_h) and every
 * constant come from ../include, shared with the v1model program; only the cells differ:
 * one bit<32> field per cell, because a Tofino stateful ALU updates one 32-bit register
 * entry per packet and returns one 32-bit value. */
#ifndef HOMAGG_TNA_HEADERS_P4
#define HOMAGG_TNA_HEADERS_P4

#include "cells.p4"
#include "../include/headers.p4"

#define CELL_FIELD(i) bit<32> c##i;
header cells_h {
    FOR_EACH_CELL(CELL_FIELD)
}

struct ingress_headers_t {
    ethernet_h ethernet;
    arp_h      arp;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
    cells_h    cells;
}

/* The slot state of the v1model program (one 96-bit entry) split so that each register
 * is read and written once per packet by one stateful ALU (docs/tofino.md). */
typedef bit<13> slot_copy_t;  /* a slot copy: (pool_base + slot) * SHADOW_COPIES + shadow */

struct ingress_metadata_t {
    bit<8>   drop_reason;
    bit<1>   to_aggregation;
    bit<1>   absorbed;
    bit<12>  pool_base;    /* below NUM_SLOTS by its width: P4Runtime refuses wider values */
    bit<16>  pool_size;
    bit<8>   num_workers;
    bit<8>   count;        /* contributions in the round, after this packet's */
    bit<16>  mcast_grp;
    PortId_t worker_port;
    bit<32>  worker_bit;
    bit<16>  slot_sum;     /* pool_base + slot, at most 4095 + 65535: no 16-bit wrap below */
    slot_copy_t slot_index;
    bit<32>  job;          /* hdr.agg.job_id widened to the tag register's width */
    bit<32>  old_owner;
    bit<32>  old_chunk;
    bit<32>  age;          /* hdr.agg.chunk - old_chunk: serial-number order (RFC 1982) */
    bit<32>  old_seen;
    bit<32>  seen_before;  /* old_seen & worker_bit */
    bit<8>   verdict;
}

/* Egress parses no cells: they pass through as payload (Tofino's PHV is shared by the
 * ingress and egress threads, so cells parsed twice would halve what fits). */
struct egress_headers_t {
    ethernet_h ethernet;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
}

struct egress_metadata_t {
    bit<8> drop_reason;
}

#endif
