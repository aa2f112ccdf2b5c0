/* Forwarding (p4src/forwarding.p4): proxy ARP for the addresses the controller knows,
 * the check of service source addresses, IPv4 LPM routing with static neighbour rewriting, hand-off to aggregation. */
#pragma once
#include "maps.h"
#include "parser.h"

struct metadata {
    __u32 ingress_port;
    __u32 packet_length;
    __u32 drop_reason;
    __u32 to_aggregation;
    __u32 absorbed;
    __u32 to_parent;   /* a leaf's partial (or its re-send) goes up to the parent */
    __u32 to_delivery; /* a result the aggregation emitted: the egress delivers it */
    __u32 egress_port; /* unicast destination (egress_spec) */
    __u32 mcast_grp;   /* != 0: replicate to the group */
    __u32 emit;        /* egress_spec was set: the packet leaves */
};

static __always_inline void copy_mac(__u8 *dst, const __u8 *src)
{
    __builtin_memcpy(dst, src, 6);
}

/* The addressing of a frame the switch sends from a service address (a result to a worker,
 * a leaf's partial to its parent): MACs, IPv4 addresses, RESULT_TTL, source port
 * AGG_UDP_PORT and no UDP checksum. src_mac may point into the frame's destination MAC. */
static __always_inline void from_service(struct ethhdr *eth, struct iphdr *ip, struct udphdr *udp,
                                         const __u8 *src_mac, const __u8 *dst_mac, __be32 saddr,
                                         __be32 daddr, __be16 dport)
{
    copy_mac(eth->h_source, src_mac);
    copy_mac(eth->h_dest, dst_mac);
    ip->saddr = saddr;
    ip->daddr = daddr;
    ip->ttl = RESULT_TTL;
    udp->source = bpf_htons(AGG_UDP_PORT);
    udp->dest = dport;
    udp->check = 0;
}

static __always_inline void arp_reply(struct headers *h, struct metadata *m)
{
    struct arp_h *arp = h->arp;
    if (!(arp->oper == bpf_htons(ARP_OPER_REQUEST) && arp->htype == bpf_htons(ARP_HTYPE_ETHERNET)
          && arp->ptype == bpf_htons(ETHERTYPE_IPV4) && arp->hlen == 6 && arp->plen == 4)) {
        m->drop_reason = DROP_UNSUPPORTED;
        return;
    }
    __u32 tpa = bpf_ntohl(*(__be32 *)arp->tpa);
    struct arp_params *p = bpf_map_lookup_elem(&arp_responder, &tpa);
    if (!p) {
        m->drop_reason = DROP_NO_ROUTE;
        return;
    }
    __u8 target[4];
    __builtin_memcpy(target, arp->tpa, 4);
    arp->oper = bpf_htons(ARP_OPER_REPLY);
    copy_mac(arp->tha, arp->sha);
    __builtin_memcpy(arp->tpa, arp->spa, 4);
    copy_mac(arp->sha, p->mac);
    __builtin_memcpy(arp->spa, target, 4);
    copy_mac(h->eth->h_dest, h->eth->h_source);
    copy_mac(h->eth->h_source, p->mac);
    m->egress_port = m->ingress_port;
    m->emit = 1;
}

/* ipv4_lpm's entry for the packet's destination, NULL when it has none. */
static __always_inline struct route_params *ipv4_lpm_lookup(const struct iphdr *ip)
{
    struct lpm_key key = {.prefixlen = 32};
    __builtin_memcpy(key.addr, &ip->daddr, 4);
    return bpf_map_lookup_elem(&ipv4_lpm, &key);
}

/* service_source: whether a frame from ip's source may come in on port (the switch's own
 * service address never, another switch's of the tree only on the port toward it). */
static __always_inline int source_allowed(const struct iphdr *ip, __u32 port)
{
    __u32 src = bpf_ntohl(ip->saddr);
    struct service_params *s = bpf_map_lookup_elem(&service_source, &src);
    if (!s)
        return 1;
    return s->action == PEER_SERVICE && s->port == port;
}

/* Whether Forwarding.apply() hands the packet to aggregation, changing nothing (the XDP
 * stage asks before it touches a slot). */
static __always_inline int to_aggregation(const struct headers *h, __u32 ingress_port)
{
    const struct iphdr *ip = h->ipv4;
    if (!ip || h->arp || ip->ihl != 5 || ip->ttl <= 1 || !source_allowed(ip, ingress_port))
        return 0;
    struct route_params *r = ipv4_lpm_lookup(ip);
    return r && r->action == IPV4_AGGREGATE;
}

static __always_inline void ipv4_forward(struct headers *h, struct metadata *m)
{
    struct iphdr *ip = h->ipv4;
    if (ip->ihl != 5) {
        m->drop_reason = DROP_UNSUPPORTED;
        return;
    }
    if (ip->ttl <= 1) {
        m->drop_reason = DROP_TTL_EXPIRED;
        return;
    }
    if (!source_allowed(ip, m->ingress_port)) {
        m->drop_reason = DROP_WRONG_PORT;
        return;
    }
    struct route_params *r = ipv4_lpm_lookup(ip);
    if (r && r->action == IPV4_ROUTE) {
        m->egress_port = r->port;
        m->emit = 1;
        copy_mac(h->eth->h_source, r->src_mac);
        copy_mac(h->eth->h_dest, r->dst_mac);
        ip->ttl -= 1;
    } else if (r && r->action == IPV4_AGGREGATE) {
        m->to_aggregation = 1;
    } else {
        m->drop_reason = DROP_NO_ROUTE;
    }
}

/* Forwarding.apply() */
static __always_inline void forwarding(struct headers *h, struct metadata *m)
{
    if (h->arp)
        arp_reply(h, m);
    else if (h->ipv4)
        ipv4_forward(h, m);
    else
        m->drop_reason = DROP_UNSUPPORTED;
}
