/* The program's state: the P4 tables as hash maps (written by the control plane,
 * homagg/ebpf/maps.py mirrors these structs), the counters as per-CPU arrays and hashes
 * (summed when read), the slot copies as one array of spin-locked entries. */
#pragma once
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "homagg_consts.h"

#define MAX_REPLICAS 64 /* replicas of one multicast group */
#define PORT_SLOTS (MAX_SWITCH_PORT + 1)

enum ipv4_action { IPV4_NO_ROUTE = 0, IPV4_ROUTE = 1, IPV4_AGGREGATE = 2 };
enum service_action { OWN_SERVICE = 1, PEER_SERVICE = 2 };

struct count { __u64 packets; __u64 bytes; };
struct job_rank { __u32 job_id; __u32 rank; };
struct lpm_key { __u32 prefixlen; __u8 addr[4]; };
struct arp_params { __u8 mac[6]; __u8 pad[2]; };
struct route_params { __u32 action; __u32 port; __u8 src_mac[6]; __u8 dst_mac[6]; };
/* service_source: a service address (host order) -> own_service, or peer_service(port). */
struct service_params { __u32 action; __u32 port; };
struct job_params { __u32 pool_base; __u32 pool_size; __u32 num_workers; __u32 mcast_grp; };
struct worker_params { __u32 port; __u32 worker_bit; };
/* set_uplink: this switch is a leaf of the job; its partials go up to the parent. */
struct uplink_params { __u32 port; __u32 rank; __be32 parent_ip; __u8 parent_mac[6]; __u8 pad[2]; };
struct recipient { __u8 mac[6]; __be16 udp_port; __be32 ip; };
struct replica { __u32 port; __u32 rid; };
struct mcast_group { __u32 size; struct replica replicas[MAX_REPLICAS]; };
struct cells { __be32 v[CELLS_PER_PKT]; };

/* One slot copy: slot_state and its cells, under one lock (XDP/TC run on every CPU).
 * count's top bit is SLOT_FINAL (a leaf stored the parent's result), the rest the count. */
struct slot {
    struct bpf_spin_lock lock;
    __u32 job_id;
    __u32 chunk;
    __u32 seen;
    __u32 count;
    __u32 exp;
    __s32 cells[CELLS_PER_PKT];
};

#define MAP(kind, name, k, v, n, ...) \
    struct { __uint(type, kind); __type(key, k); __type(value, v); \
             __uint(max_entries, n); __VA_ARGS__ } name SEC(".maps")

MAP(BPF_MAP_TYPE_ARRAY, pipeline, __u32, __u32, 1);            /* [0] != 0: a program is set */
MAP(BPF_MAP_TYPE_ARRAY, port_ifindex, __u32, __u32, PORT_SLOTS); /* switch port -> ifindex */
MAP(BPF_MAP_TYPE_HASH, ifindex_port, __u32, __u32, PORT_SLOTS);  /* ifindex -> switch port */
MAP(BPF_MAP_TYPE_HASH, arp_responder, __u32, struct arp_params, ARP_TABLE_SIZE);
MAP(BPF_MAP_TYPE_LPM_TRIE, ipv4_lpm, struct lpm_key, struct route_params, IPV4_TABLE_SIZE,
    __uint(map_flags, BPF_F_NO_PREALLOC););
MAP(BPF_MAP_TYPE_HASH, service_source, __u32, struct service_params, SERVICE_SOURCE_TABLE_SIZE);
MAP(BPF_MAP_TYPE_HASH, job_table, __u32, struct job_params, MAX_JOBS);
MAP(BPF_MAP_TYPE_HASH, worker_table, struct job_rank, struct worker_params, MAX_WORKERS);
MAP(BPF_MAP_TYPE_HASH, uplink, __u32, struct uplink_params, MAX_JOBS);
MAP(BPF_MAP_TYPE_HASH, result_rewrite, struct job_rank, struct recipient, MAX_WORKERS);
MAP(BPF_MAP_TYPE_HASH, multicast_groups, __u32, struct mcast_group, MAX_JOBS);
MAP(BPF_MAP_TYPE_PERCPU_HASH, job_packets, __u32, struct count, MAX_JOBS);
MAP(BPF_MAP_TYPE_PERCPU_HASH, worker_packets, struct job_rank, struct count, MAX_WORKERS);
MAP(BPF_MAP_TYPE_PERCPU_ARRAY, ingress_drops, __u32, struct count, NUM_DROP_REASONS);
MAP(BPF_MAP_TYPE_PERCPU_ARRAY, egress_drops, __u32, struct count, NUM_DROP_REASONS);
MAP(BPF_MAP_TYPE_PERCPU_ARRAY, event_counter, __u32, struct count, NUM_EVENTS);
MAP(BPF_MAP_TYPE_PERCPU_ARRAY, cells_scratch, __u32, struct cells, 1);
MAP(BPF_MAP_TYPE_ARRAY, slots, __u32, struct slot, NUM_SLOT_COPIES);

static __always_inline void count_in(void *map, __u32 index, __u32 bytes)
{
    struct count *c = bpf_map_lookup_elem(map, &index);
    if (c) {
        c->packets += 1;
        c->bytes += bytes;
    }
}

static __always_inline void count_key(void *map, const void *key, __u32 bytes)
{
    struct count *c = bpf_map_lookup_elem(map, key);
    if (c) {
        c->packets += 1;
        c->bytes += bytes;
    }
}
