/* The XDP stage of SwitchIngress: on every port, before the kernel builds a socket buffer,
 * it runs the parser, Forwarding's decision and Aggregation's checks, and consumes the
 * contributions whose effect is only on their slot copy: one that does not complete its
 * round (added under the slot's lock, counted as a contribution), a duplicate and a stale
 * one (counted as drops for their reason). Everything else, a completing contribution, a
 * resend (of a result, or of a leaf's partial up), every result packet (a parent's result
 * at a leaf) and whatever is not a valid contribution, passes unchanged to the TC program
 * (homagg_tc.c), which classifies it again under the lock: each packet's effect on a slot
 * happens in one stage, so the two stages keep the serial semantics of docs/protocol.md.
 * A tree job's contributions are absorbed like any other's: what differs at a leaf (the
 * partial, its re-send, the parent's result) all happens in TC. */
#pragma once
#include "aggregation.h"

/* Count what the TC program would have counted for a consumed contribution. */
static __always_inline void count_consumed(const struct contribution *k, __u32 rank,
                                           __u32 verdict, __u32 bytes)
{
    struct job_rank jr = {.job_id = k->job_id, .rank = rank};
    count_key(&job_packets, &k->job_id, bytes);
    count_key(&worker_packets, &jr, bytes);
    if (verdict == VERDICT_FRESH || verdict == VERDICT_COMBINE)
        count_in(&event_counter, EVENT_CONTRIBUTION, bytes);
    else
        count_in(&ingress_drops, verdict == VERDICT_DUPLICATE ? DROP_DUPLICATE : DROP_STALE,
                 bytes);
}

/* Aggregation's absorbing part: XDP_DROP when the contribution was consumed, else XDP_PASS
 * with the slot copy untouched. */
static __always_inline int absorb(struct xdp_md *ctx, const struct headers *h,
                                  const struct metadata *m)
{
    __u32 index = 0, mcast_grp = 0, count = 0, exp = 0, zero = 0;
    struct contribution k = {};
    if ((h->agg->flags & AGG_FLAG_RESULT) || invalid(h) != DROP_NONE
        || find_slot(h, m, &k, &index, &mcast_grp, 0) != DROP_NONE)
        return XDP_PASS;
    __u32 rank = h->agg->rank;
    struct slot *s = bpf_map_lookup_elem(&slots, &index);
    struct cells *c = bpf_map_lookup_elem(&cells_scratch, &zero);
    if (!s || !c || bpf_xdp_load_bytes(ctx, CELLS_OFF, c->v, CELLS_BYTES))
        return XDP_PASS;
    __u32 verdict = update_slot(s, c, &k, &count, &exp, 1);
    if (verdict == VERDICT_TO_TC)
        return XDP_PASS;
    count_consumed(&k, rank, verdict, m->packet_length);
    return XDP_DROP;
}
