/* Aggregation (p4src/aggregation.p4): validate a contribution, find the job's pool and the
 * worker's bit, classify it against its slot copy and combine the cells; at a leaf of a
 * tree job (an uplink entry) a completed copy's partial goes up to the parent, and the
 * parent's result comes back as a result packet (uplink.h). The slot copy's state and
 * cells change under the slot's bpf_spin_lock: the program runs on every CPU at once, and
 * two workers' packets for one slot may meet. */
#pragma once
#include "uplink.h"

/* VERDICT_TO_TC: the XDP stage left the slot copy as it was (the contribution completes
 * its round or is a resend); the TC program classifies it again. */
enum verdict {
    VERDICT_TO_TC = 0, VERDICT_FRESH, VERDICT_COMBINE, VERDICT_RESEND, VERDICT_DUPLICATE,
    VERDICT_STALE, VERDICT_RESEND_UP
};

struct contribution {
    __u32 job_id;
    __u32 chunk;
    __u32 worker_bit;
    __u32 exp;
    __u32 op;
    __u32 num_workers;
    __u32 has_uplink; /* a leaf of the job: a complete copy's resend goes up (TC only) */
};

/* Loops over every cell of the packet (c) and of the slot copy (s); no helper calls may
 * happen under the lock, and the op is chosen outside the loop. */
#define EACH_CELL(body) \
    for (int i = 0; i < CELLS_PER_PKT; i++) { body }
#define COMBINE(expr)                                        \
    EACH_CELL(__u32 a = (__u32)s->cells[i];                  \
              __u32 b = bpf_ntohl(c->v[i]);                  \
              __u32 r = (expr);                              \
              s->cells[i] = (__s32)r;                        \
              c->v[i] = bpf_htonl(r);)
#define LANES_ADD(T) ((((a & ~(T)) + (b & ~(T))) ^ ((a ^ b) & (T))))

static __always_inline void combine_cells(struct slot *s, struct cells *c, __u32 op)
{
    if (op == AGG_OP_ADD) {
        COMBINE(a + b)
    } else if (op == AGG_OP_ADD16) {
        COMBINE(LANES_ADD(LANE16_TOP_BITS))
    } else if (op == AGG_OP_ADD8) {
        COMBINE(LANES_ADD(LANE8_TOP_BITS))
    } else if (op == AGG_OP_OR) {
        COMBINE(a | b)
    } else {
        COMBINE((__s32)a > (__s32)b ? a : b)
    }
}

/* update_slot and the cells actions, as one critical section; returns the verdict and
 * leaves the slot's count and exponent in *count and *exp. With absorb_only (the XDP
 * stage) a contribution that would complete its round, or a resend (up or down), changes
 * nothing and gets VERDICT_TO_TC: every packet's effect happens under the lock in exactly
 * one stage. A complete copy's count may carry SLOT_FINAL (a leaf holds the parent's
 * result): RESEND then, RESEND_UP while a leaf still waits for it. */
static __always_inline __u32 update_slot(struct slot *s, struct cells *c,
                                         const struct contribution *k, __u32 *count, __u32 *exp,
                                         const int absorb_only)
{
    __u32 verdict;
    bpf_spin_lock(&s->lock);
    __u32 age = k->chunk - s->chunk; /* serial-number arithmetic (RFC 1982) */
    __u32 older = age >> 31;
    if (s->job_id != k->job_id || (age != 0 && !older)) {
        if (absorb_only && k->num_workers == 1) {
            verdict = VERDICT_TO_TC;
        } else {
            verdict = VERDICT_FRESH;
            s->job_id = k->job_id;
            s->chunk = k->chunk;
            s->seen = k->worker_bit;
            s->count = 1;
            s->exp = k->exp;
            EACH_CELL(s->cells[i] = (__s32)bpf_ntohl(c->v[i]);)
        }
    } else if (older) {
        verdict = VERDICT_STALE;
    } else if ((s->seen & k->worker_bit) == 0) {
        if (absorb_only && ((s->count + 1) & 0xff) == k->num_workers) {
            verdict = VERDICT_TO_TC;
        } else {
            verdict = VERDICT_COMBINE;
            s->seen |= k->worker_bit;
            s->count = (s->count + 1) & 0xff;
            s->exp = s->exp > k->exp ? s->exp : k->exp;
            combine_cells(s, c, k->op);
        }
    } else if ((s->count & SLOT_COUNT_MASK) == k->num_workers) {
        if (absorb_only) {
            verdict = VERDICT_TO_TC;
        } else {
            verdict = k->has_uplink && !(s->count & SLOT_FINAL) ? VERDICT_RESEND_UP
                                                                : VERDICT_RESEND;
            EACH_CELL(c->v[i] = bpf_htonl((__u32)s->cells[i]);)
        }
    } else {
        verdict = VERDICT_DUPLICATE;
    }
    *count = s->count;
    *exp = s->exp;
    bpf_spin_unlock(&s->lock);
    return verdict;
}

/* The header checks before any table, for a contribution and for a result alike (a
 * result's way differs after them): the reason to drop, else DROP_NONE. */
static __always_inline __u32 invalid(const struct headers *h)
{
    const struct agg_h *agg = h->agg;
    __u32 ncells = bpf_ntohs(agg->ncells);
    if (agg->version != AGG_VERSION || agg->shadow >= SHADOW_COPIES)
        return DROP_BAD_HEADER;
    if (ncells == 0 || ncells > CELLS_PER_PKT || h->udp->len != bpf_htons(AGG_UDP_LENGTH)
        || h->ipv4->tot_len != bpf_htons(AGG_IPV4_LENGTH))
        return DROP_BAD_LENGTH;
    if (agg->op < AGG_OP_ADD || agg->op > AGG_OP_LAST)
        return DROP_BAD_OP;
    return DROP_NONE;
}

/* The slot copy's index in *index; non-zero when the slot is outside the job's pool or
 * the switch (never pool_base + slot in 32 bits: a pool_base near 2^32 would wrap it
 * round into another job's slots). */
static __always_inline int pool_index(const struct job_params *job, const struct agg_h *agg,
                                      __u32 *index)
{
    __u32 slot = bpf_ntohs(agg->slot), base = job->pool_base;
    if (base >= NUM_SLOTS || slot >= job->pool_size || slot >= NUM_SLOTS - base)
        return -1;
    *index = ((base + slot) << SHADOW_BITS) | agg->shadow;
    return 0;
}

/* job_table and worker_table (with their direct counters unless the XDP stage asks: it
 * counts only the packets it consumes), the ingress port and the pool: the slot copy's
 * index in *index and the contribution in *k, or the reason to drop. */
static __always_inline __u32 find_slot(const struct headers *h, const struct metadata *m,
                                       struct contribution *k, __u32 *index, __u32 *mcast_grp,
                                       const int count_hits)
{
    const struct agg_h *agg = h->agg;
    __u32 job_id = bpf_ntohs(agg->job_id);
    struct job_params *job = bpf_map_lookup_elem(&job_table, &job_id);
    if (!job)
        return DROP_UNKNOWN_JOB;
    if (count_hits)
        count_key(&job_packets, &job_id, m->packet_length);
    struct job_rank jr = {.job_id = job_id, .rank = agg->rank};
    struct worker_params *w = bpf_map_lookup_elem(&worker_table, &jr);
    if (!w)
        return DROP_BAD_RANK;
    if (count_hits)
        count_key(&worker_packets, &jr, m->packet_length);
    if (w->port != m->ingress_port)
        return DROP_WRONG_PORT;
    if (pool_index(job, agg, index))
        return DROP_SLOT_OUT_OF_POOL;
    *mcast_grp = job->mcast_grp;
    k->job_id = job_id;
    k->chunk = bpf_ntohl(agg->chunk);
    k->worker_bit = w->worker_bit;
    k->exp = agg->exp;
    k->op = agg->op;
    k->num_workers = job->num_workers & 0xff;
    return DROP_NONE;
}

/* After the cells: count the event and say what leaves: a completed round's result to
 * the group (at a leaf its partial, up to the parent), a resent result back to its sender,
 * a leaf's partial up again; or drop a duplicate or stale contribution. Returns the
 * flags of the packet that leaves, -1 when none does. */
static __always_inline int answer(struct metadata *m, __u32 verdict, __u32 count,
                                  const struct contribution *k, __u32 mcast_grp)
{
    if (verdict == VERDICT_FRESH || verdict == VERDICT_COMBINE) {
        count_in(&event_counter, EVENT_CONTRIBUTION, m->packet_length);
        if (count != k->num_workers) {
            m->absorbed = 1;
            return -1;
        }
        if (k->has_uplink) {
            m->to_parent = 1;
            count_in(&event_counter, EVENT_PARTIAL, m->packet_length);
            return 0;
        }
        m->mcast_grp = mcast_grp;
        m->to_delivery = 1;
        count_in(&event_counter, EVENT_RESULT, m->packet_length);
        return AGG_FLAG_RESULT;
    }
    if (verdict == VERDICT_RESEND_UP) {
        m->to_parent = 1;
        count_in(&event_counter, EVENT_PARTIAL, m->packet_length);
        return AGG_FLAG_RETX;
    }
    if (verdict == VERDICT_RESEND) {
        m->egress_port = m->ingress_port;
        m->to_delivery = 1;
        count_in(&event_counter, EVENT_RESENT, m->packet_length);
        return AGG_FLAG_RESULT | AGG_FLAG_RETX;
    }
    m->drop_reason = verdict == VERDICT_DUPLICATE ? DROP_DUPLICATE : DROP_STALE;
    return -1;
}

/* The frame's aggregation header after a helper that may have moved the packet. */
static __always_inline struct agg_h *agg_header(struct __sk_buff *skb)
{
    struct agg_h *agg = (void *)(long)skb->data + AGG_OFF;
    return (void *)(agg + 1) > (void *)(long)skb->data_end ? 0 : agg;
}

/* The contribution path (flags without RESULT): classify, combine, answer; a leaf's
 * partial leaves toward the parent (to_parent). */
static __always_inline void contribution(struct __sk_buff *skb, const struct headers *h,
                                         struct metadata *m)
{
    __u32 index = 0, mcast_grp = 0, count = 0, exp = 0, zero = 0;
    struct contribution k = {};
    struct uplink_params up = {};
    m->drop_reason = find_slot(h, m, &k, &index, &mcast_grp, 1);
    if (m->drop_reason != DROP_NONE)
        return;
    k.has_uplink = uplink_of(k.job_id, &up);
    struct slot *s = bpf_map_lookup_elem(&slots, &index);
    struct cells *c = bpf_map_lookup_elem(&cells_scratch, &zero);
    if (!s || !c || bpf_skb_load_bytes(skb, CELLS_OFF, c->v, CELLS_BYTES)) {
        m->drop_reason = DROP_TRUNCATED;
        return;
    }
    __u32 verdict = update_slot(s, c, &k, &count, &exp, 0);
    int flags = answer(m, verdict, count, &k, mcast_grp);
    if (flags < 0)
        return;
    if (bpf_skb_store_bytes(skb, CELLS_OFF, c->v, CELLS_BYTES, 0)
        || (m->to_parent && to_parent(skb, m, &up))) {
        m->drop_reason = DROP_TRUNCATED;
        return;
    }
    struct agg_h *agg = agg_header(skb);
    if (!agg) {
        m->drop_reason = DROP_TRUNCATED;
        return;
    }
    agg->flags = flags;
    agg->exp = exp;
}

/* The result path (flags with RESULT): only a leaf of the job takes one, from its parent
 * on the uplink port with its uplink rank, for a slot of the job's pool; accept_result
 * then decides and the result goes to the job's group. */
static __always_inline void result_from_parent(struct __sk_buff *skb, const struct headers *h,
                                               struct metadata *m)
{
    __u32 index = 0, zero = 0;
    struct uplink_params up = {};
    const struct agg_h *agg = h->agg;
    __u32 job_id = bpf_ntohs(agg->job_id), chunk = bpf_ntohl(agg->chunk), exp = agg->exp;
    struct job_params *job = bpf_map_lookup_elem(&job_table, &job_id);
    if (!job) {
        m->drop_reason = DROP_UNKNOWN_JOB;
        return;
    }
    count_key(&job_packets, &job_id, m->packet_length);
    if (!uplink_of(job_id, &up))
        m->drop_reason = DROP_BAD_HEADER; /* not a leaf of this job: no result is awaited */
    else if (up.port != m->ingress_port)
        m->drop_reason = DROP_WRONG_PORT;
    else if (agg->rank != (up.rank & 0xff))
        m->drop_reason = DROP_BAD_RANK;
    else if (pool_index(job, agg, &index))
        m->drop_reason = DROP_SLOT_OUT_OF_POOL;
    if (m->drop_reason != DROP_NONE)
        return;
    __u32 num_workers = job->num_workers & 0xff, mcast_grp = job->mcast_grp;
    struct slot *s = bpf_map_lookup_elem(&slots, &index);
    struct cells *c = bpf_map_lookup_elem(&cells_scratch, &zero);
    if (!s || !c || bpf_skb_load_bytes(skb, CELLS_OFF, c->v, CELLS_BYTES)) {
        m->drop_reason = DROP_TRUNCATED;
        return;
    }
    m->drop_reason = accept_result(s, c, job_id, chunk, num_workers, exp);
    if (m->drop_reason != DROP_NONE)
        return;
    struct agg_h *out = agg_header(skb);
    if (!out) {
        m->drop_reason = DROP_TRUNCATED;
        return;
    }
    out->flags = AGG_FLAG_RESULT;
    m->mcast_grp = mcast_grp;
    m->to_delivery = 1;
    count_in(&event_counter, EVENT_RESULT, m->packet_length);
}

/* Aggregation.apply(); the packet's header pointers are stale after it. */
static __always_inline void aggregation(struct __sk_buff *skb, struct headers *h,
                                        struct metadata *m)
{
    if (!h->agg) {
        m->drop_reason = DROP_BAD_HEADER; /* routed to the service address, not aggregation */
        return;
    }
    m->drop_reason = invalid(h);
    if (m->drop_reason != DROP_NONE)
        return;
    if (h->agg->flags & AGG_FLAG_RESULT)
        result_from_parent(skb, h, m);
    else
        contribution(skb, h, m);
}
