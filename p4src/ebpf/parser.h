/* SwitchParser (p4src/parser.p4): Ethernet, ARP or IPv4/UDP, then the aggregation header
 * and cells on AGG_UDP_PORT. A header that does not fit sets the parser error; the ingress
 * drops the packet as truncated. Offsets are fixed: only option-less IPv4 goes past IPv4. */
#pragma once
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include "homagg_consts.h"

#define ETH_OFF 0
#define L3_OFF 14
#define UDP_OFF (L3_OFF + 20)
#define AGG_OFF (UDP_OFF + 8)
#define CELLS_OFF (AGG_OFF + 16)
#define CELLS_BYTES (4 * CELLS_PER_PKT)

struct arp_h {
    __be16 htype; __be16 ptype; __u8 hlen; __u8 plen; __be16 oper;
    __u8 sha[6]; __u8 spa[4]; __u8 tha[6]; __u8 tpa[4];
} __attribute__((packed));

struct headers {
    struct ethhdr *eth;
    struct arp_h *arp;
    struct iphdr *ipv4;
    struct udphdr *udp;
    struct agg_h *agg; /* valid only when the cells are in the frame too */
    int error;
};

static __always_inline void parse(void *data, void *end, struct headers *h)
{
    h->eth = data;
    if ((void *)(h->eth + 1) > end) {
        h->error = 1;
        return;
    }
    if (h->eth->h_proto == bpf_htons(ETHERTYPE_ARP)) {
        h->arp = (void *)(h->eth + 1);
        if ((void *)(h->arp + 1) > end) {
            h->arp = 0;
            h->error = 1;
        }
        return;
    }
    if (h->eth->h_proto != bpf_htons(ETHERTYPE_IPV4))
        return;
    h->ipv4 = (void *)(h->eth + 1);
    if ((void *)(h->ipv4 + 1) > end) {
        h->ipv4 = 0;
        h->error = 1;
        return;
    }
    if (h->ipv4->ihl != 5 || (h->ipv4->frag_off & bpf_htons(0x1fff)) != 0
        || h->ipv4->protocol != IP_PROTO_UDP)
        return;
    h->udp = (void *)(h->ipv4 + 1);
    if ((void *)(h->udp + 1) > end) {
        h->udp = 0;
        h->error = 1;
        return;
    }
    if (h->udp->dest != bpf_htons(AGG_UDP_PORT))
        return;
    h->agg = (void *)(h->udp + 1);
    if ((void *)(h->agg + 1) + CELLS_BYTES > end) {
        h->agg = 0;
        h->error = 1;
    }
}
