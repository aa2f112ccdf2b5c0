// SPDX-License-Identifier: GPL-2.0
/* The homagg switch (p4src/homagg.p4) as a TC ingress program on every switch port:
 * parser, SwitchIngress (forwarding, aggregation), replication, SwitchEgress (delivery)
 * and the checksum; and its XDP stage (absorb.h), which consumes the contributions that
 * only change their slot copy before a socket buffer exists. docs/ebpf.md explains the
 * maps, the locking, the two stages and the replication. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "absorb.h"
#include "delivery.h"

static __always_inline void switch_ingress_apply(struct __sk_buff *skb, struct metadata *m,
                                                 struct egress_src *o)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct headers h = {};
    parse(data, end, &h);
    o->has_ipv4 = h.ipv4 != 0;
    o->has_agg = h.agg != 0;
    if (h.error) {
        m->drop_reason = DROP_TRUNCATED;
        return;
    }
    forwarding(&h, m);
    if (m->drop_reason == DROP_NONE && m->to_aggregation)
        aggregation(skb, &h, m);
}

SEC("tc")
int switch_ingress(struct __sk_buff *skb)
{
    __u32 zero = 0, ifindex = skb->ingress_ifindex;
    __u32 *loaded = bpf_map_lookup_elem(&pipeline, &zero);
    __u32 *port = bpf_map_lookup_elem(&ifindex_port, &ifindex);
    if (!loaded || !*loaded || !port)
        return TC_ACT_SHOT; /* no program yet: everything is dropped, as on BMv2 */
    struct metadata m = {.ingress_port = *port, .packet_length = skb->len};
    struct egress_src o = {};
    if (skb->data_end - skb->data < skb->len)
        bpf_skb_pull_data(skb, skb->len);
    switch_ingress_apply(skb, &m, &o);
    if (m.drop_reason != DROP_NONE) {
        count_in(&ingress_drops, m.drop_reason, m.packet_length);
        return TC_ACT_SHOT;
    }
    if (m.absorbed || egress_source(skb, &o))
        return TC_ACT_SHOT;
    if (m.mcast_grp) {
        replicate(skb, &m, &o);
        return TC_ACT_SHOT;
    }
    ifindex = port_to_ifindex(m.egress_port);
    if (switch_egress(skb, &m, 0, &o) || !ifindex)
        return TC_ACT_SHOT;
    return bpf_redirect(ifindex, 0);
}

SEC("xdp")
int switch_ingress_xdp(struct xdp_md *ctx)
{
    __u32 zero = 0, ifindex = ctx->ingress_ifindex;
    __u32 *loaded = bpf_map_lookup_elem(&pipeline, &zero);
    __u32 *port = bpf_map_lookup_elem(&ifindex_port, &ifindex);
    if (!loaded || !*loaded || !port)
        return XDP_PASS; /* the TC program decides (and counts) */
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct headers h = {};
    parse(data, end, &h);
    if (h.error || !h.agg || !to_aggregation(&h, *port))
        return XDP_PASS;
    struct metadata m = {.ingress_port = *port, .packet_length = end - data};
    return absorb(ctx, &h, &m);
}

char LICENSE[] SEC("license") = "GPL";
