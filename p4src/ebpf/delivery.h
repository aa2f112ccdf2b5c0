/* SwitchEgress with ResultDelivery (p4src/delivery.p4) and the checksum: each copy of a
 * result the aggregation emitted (metadata.to_delivery) leaves as a unicast UDP datagram from the service address to one worker; replicas
 * carry rank + 1 as their rid. Replication (the P4 replication engine) is a loop of
 * bpf_clone_redirect over the group's replicas, each rewritten for its recipient. */
#pragma once
#include "aggregation.h"

/* What every copy starts from: the packet as the ingress left it. */
struct egress_src {
    __u8 eth_dst[6];
    __u8 rank;
    __be32 ip_dst;
    __u32 has_ipv4;
    __u32 has_agg;
};

static __always_inline void ipv4_checksum(struct iphdr *ip)
{
    __u16 *w = (__u16 *)ip;
    __u32 sum = 0;
    ip->check = 0;
#pragma unroll
    for (int i = 0; i < 10; i++)
        sum += w[i];
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    ip->check = (__u16)~sum;
}

/* ResultDelivery.apply(): rewrite a result for (job, rank); non-zero when it has no
 * recipient. */
static __always_inline int result_delivery(void *data, void *end, __u32 rid,
                                           const struct egress_src *o)
{
    struct ethhdr *eth = data;
    struct iphdr *ip = data + L3_OFF;
    struct udphdr *udp = data + UDP_OFF;
    struct agg_h *agg = data + AGG_OFF;
    if ((void *)(agg + 1) > end)
        return -1;
    if (rid != 0)
        agg->rank = (rid - 1) & 0xff;
    else
        agg->rank = o->rank;
    struct job_rank key = {.job_id = bpf_ntohs(agg->job_id), .rank = agg->rank};
    struct recipient *r = bpf_map_lookup_elem(&result_rewrite, &key);
    if (!r)
        return -1;
    from_service(eth, ip, udp, o->eth_dst, r->mac, o->ip_dst, r->ip, r->udp_port);
    return 0;
}

/* SwitchEgress.apply() and the checksum for one copy; non-zero when it is dropped. */
static __always_inline int switch_egress(struct __sk_buff *skb, const struct metadata *m,
                                         __u32 rid, const struct egress_src *o)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    /* Only what the aggregation emitted as a result: a routed frame keeps its headers. */
    if (m->to_delivery && result_delivery(data, end, rid, o)) {
        count_in(&egress_drops, DROP_NO_RECIPIENT, m->packet_length);
        return -1;
    }
    if (o->has_ipv4) {
        struct iphdr *ip = data + L3_OFF;
        if ((void *)(ip + 1) > end)
            return -1;
        ipv4_checksum(ip);
    }
    return 0;
}

/* The ingress's output, read back from the frame (the headers' pointers are stale). */
static __always_inline int egress_source(struct __sk_buff *skb, struct egress_src *o)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return -1;
    copy_mac(o->eth_dst, eth->h_dest);
    if (!o->has_agg)
        return 0;
    struct iphdr *ip = data + L3_OFF;
    struct agg_h *agg = data + AGG_OFF;
    if ((void *)(agg + 1) > end)
        return -1;
    o->ip_dst = ip->daddr;
    o->rank = agg->rank;
    return 0;
}

static __always_inline __u32 port_to_ifindex(__u32 port)
{
    __u32 *ifindex = bpf_map_lookup_elem(&port_ifindex, &port);
    return ifindex ? *ifindex : 0;
}

/* The replication engine: one rewritten clone per replica of the group. */
static __always_inline void replicate(struct __sk_buff *skb, const struct metadata *m,
                                      const struct egress_src *o)
{
    struct mcast_group *g = bpf_map_lookup_elem(&multicast_groups, &m->mcast_grp);
    if (!g)
        return;
    for (__u32 i = 0; i < MAX_REPLICAS; i++) {
        if (i >= g->size)
            break;
        struct replica r = g->replicas[i];
        __u32 ifindex = port_to_ifindex(r.port);
        if (switch_egress(skb, m, r.rid, o) == 0 && ifindex)
            bpf_clone_redirect(skb, ifindex, 0);
    }
}
