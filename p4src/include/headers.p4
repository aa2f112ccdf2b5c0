/* Headers and metadata. */
#ifndef HOMAGG_HEADERS_P4
#define HOMAGG_HEADERS_P4

#include "constants.p4"

header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header arp_h {
    bit<16>     htype;
    bit<16>     ptype;
    bit<8>      hlen;
    bit<8>      plen;
    bit<16>     oper;
    mac_addr_t  sha;
    ipv4_addr_t spa;
    mac_addr_t  tha;
    ipv4_addr_t tpa;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

/* The aggregation header, 16 bytes; docs/protocol.md describes each field and
 * aggwire/header.py mirrors it (tests/aggwire/test_header.py compares the two). */
header agg_h {
    bit<8>   version;
    bit<8>   flags;
    bit<8>   op;
    bit<8>   rank;
    job_id_t job_id;
    bit<16>  slot;    /* relative to the job's pool */
    bit<8>   shadow;  /* which of the slot's two copies (shadow sets), 0 or 1 */
    bit<8>   exp;     /* biased exponent, combined with MAX whatever the op */
    bit<16>  ncells;
    chunk_t  chunk;   /* the job's chunk sequence number; orders rounds in a slot */
}

/* Everything below is the v1model program's; the TNA program (p4src/tofino/) has its
 * own cells, headers_t and metadata. */
#ifndef HOMAGG_TNA
#define CELL_FIELD(i) bit<256> g##i;
/* CELLS_PER_PKT int32 cells, big-endian, as 8-lane groups (lane 0 = highest bits). */
header cells_h {
    FOR_EACH_GROUP(CELL_FIELD)
}

struct headers_t {
    ethernet_h ethernet;
    arp_h      arp;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
    cells_h    cells;
}

struct metadata_t {
    bit<8>  drop_reason;
    bit<1>  to_aggregation;
    bit<1>  absorbed;        /* contribution kept in the slot, nothing to send */
    bit<1>  to_delivery;     /* a result the aggregation emitted: the egress delivers it */
    slot_index_t pool_base;  /* from the job entry: not trusted to be below NUM_SLOTS */
    bit<16> pool_size;
    bit<8>  num_workers;
    bit<16> mcast_grp;
    port_t  worker_port;
    bit<32> worker_bit;
    slot_index_t slot_index; /* (pool_base + slot) * SHADOW_COPIES + shadow */
    bit<8>  verdict;
    bit<8>  count;
    /* From the job's uplink entry (a leaf of a two-level job): where partials go up. */
    bit<1>  has_uplink;
    port_t  uplink_port;
    bit<8>  uplink_rank;
    ipv4_addr_t parent_ip;
    mac_addr_t  parent_mac;
}

#endif  /* HOMAGG_TNA */

#endif
