/* Two-level aggregation at a leaf (p4src/aggregation.p4's uplink table, to_parent and
 * accept_result; docs/protocol.md, "Two-level aggregation"): a job with an uplink entry
 * sends a completed slot copy's partial sum up to its parent as one contribution of the
 * leaf's uplink rank, and takes the parent's result back into the copy (which becomes
 * final) before it goes to the job's group. */
#pragma once
#include "forwarding.h"

/* The uplink table: 1 and the job's entry in *up when this switch is a leaf of the job. */
static __always_inline __u32 uplink_of(__u32 job_id, struct uplink_params *up)
{
    struct uplink_params *found = bpf_map_lookup_elem(&uplink, &job_id);
    if (!found)
        return 0;
    *up = *found;
    return 1;
}

/* to_parent: rewrite the frame (cells and flags already written) into a contribution of
 * rank uplink_rank from the leaf's service address to the parent's, out of the uplink
 * port; non-zero when the frame is shorter than its headers. */
static __always_inline int to_parent(struct __sk_buff *skb, struct metadata *m,
                                     const struct uplink_params *up)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + L3_OFF;
    struct udphdr *udp = data + UDP_OFF;
    struct agg_h *agg = data + AGG_OFF;
    if ((void *)(agg + 1) > end)
        return -1;
    from_service(eth, ip, udp, eth->h_dest, up->parent_mac, ip->daddr, up->parent_ip,
                 bpf_htons(AGG_UDP_PORT));
    agg->rank = up->rank & 0xff;
    m->egress_port = up->port;
    return 0;
}

/* accept_result's critical section: the parent's result (cells c, exponent exp) for
 * (job, chunk) is stored when the copy holds that round complete and not yet final.
 * DROP_NONE when stored, DROP_DUPLICATE when already final, DROP_STALE otherwise (another
 * round in the copy, or the copy not complete). */
static __always_inline __u32 accept_result(struct slot *s, const struct cells *c, __u32 job_id,
                                           __u32 chunk, __u32 num_workers, __u32 exp)
{
    __u32 reason = DROP_STALE;
    bpf_spin_lock(&s->lock);
    if (s->job_id == job_id && s->chunk == chunk) {
        if (s->count & SLOT_FINAL) {
            reason = DROP_DUPLICATE;
        } else if ((s->count & SLOT_COUNT_MASK) == num_workers) {
            reason = DROP_NONE;
            s->count |= SLOT_FINAL;
            s->exp = exp;
            for (int i = 0; i < CELLS_PER_PKT; i++)
                s->cells[i] = (__s32)bpf_ntohl(c->v[i]);
        }
    }
    bpf_spin_unlock(&s->lock);
    return reason;
}
