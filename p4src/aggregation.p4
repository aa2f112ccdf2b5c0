/* Aggregation: validates a contribution, finds the job's pool and the worker's bit, and
 * combines the cells into the slot copy (SwitchML-style shadow copies). The data plane
 * resets itself: a contribution of a newer chunk (or of another job) overwrites the slot
 * copy, so no register ever needs a control-plane write (BMv2 cannot do one over
 * P4Runtime). Each register's read-modify-write stays inside one action, which BMv2
 * executes atomically.
 * Two-level jobs: a switch with an uplink entry for the job is a leaf; a completed copy
 * goes up to the parent as one contribution (to_parent) and the parent's result, stored
 * in the copy (accept_result, the copy becomes final), is what the workers get. */
#include "include/headers.p4"

/* Per-lane int32 arithmetic on 8-lane groups: wraps per lane, no carry between lanes. */
bit<256> lanes_add(in bit<256> a, in bit<256> b) {
    return (a[255:224] + b[255:224]) ++ (a[223:192] + b[223:192])
        ++ (a[191:160] + b[191:160]) ++ (a[159:128] + b[159:128])
        ++ (a[127:96] + b[127:96]) ++ (a[95:64] + b[95:64])
        ++ (a[63:32] + b[63:32]) ++ (a[31:0] + b[31:0]);
}

/* Per-lane add of 16- or 8-bit lanes in one 256-bit add (SWAR): the lanes' low bits are
 * added with every lane's top bit cleared, so no carry can leave a lane; the top bits
 * are then the XOR of both top bits and the carry into them. Each lane wraps on its own,
 * at a few operations per group instead of one slice add per lane. */
bit<256> lanes_add_narrow(in bit<256> a, in bit<256> b, in bit<256> tops) {
    return ((a & ~tops) + (b & ~tops)) ^ ((a ^ b) & tops);
}

bit<256> lanes_add16(in bit<256> a, in bit<256> b) {
    return lanes_add_narrow(a, b, LANE16_TOP_BITS);
}

bit<256> lanes_add8(in bit<256> a, in bit<256> b) {
    return lanes_add_narrow(a, b, LANE8_TOP_BITS);
}

/* Signed max: flipping the sign bit maps int32 order onto unsigned order. */
bit<32> max_i32(in bit<32> a, in bit<32> b) {
    return ((a ^ 0x80000000) > (b ^ 0x80000000)) ? a : b;
}

bit<256> lanes_max(in bit<256> a, in bit<256> b) {
    return max_i32(a[255:224], b[255:224]) ++ max_i32(a[223:192], b[223:192])
        ++ max_i32(a[191:160], b[191:160]) ++ max_i32(a[159:128], b[159:128])
        ++ max_i32(a[127:96], b[127:96]) ++ max_i32(a[95:64], b[95:64])
        ++ max_i32(a[63:32], b[63:32]) ++ max_i32(a[31:0], b[31:0]);
}

bit<8> max_u8(in bit<8> a, in bit<8> b) {
    return a > b ? a : b;
}

#define CELL_REGISTER(i) register<bit<256>>(NUM_SLOT_COPIES) cells_g##i;
#define STORE_GROUP(i) cells_g##i.write(meta.slot_index, hdr.cells.g##i);
#define LOAD_GROUP(i) cells_g##i.read(hdr.cells.g##i, meta.slot_index);
#define COMBINE_GROUP(i, COMBINE) \
    bit<256> v##i; \
    cells_g##i.read(v##i, meta.slot_index); \
    v##i = COMBINE(v##i, hdr.cells.g##i); \
    cells_g##i.write(meta.slot_index, v##i); \
    hdr.cells.g##i = v##i;
#define ADD_GROUP(i) COMBINE_GROUP(i, lanes_add)
#define ADD16_GROUP(i) COMBINE_GROUP(i, lanes_add16)
#define ADD8_GROUP(i) COMBINE_GROUP(i, lanes_add8)
#define MAX_GROUP(i) COMBINE_GROUP(i, lanes_max)
#define OR_GROUP(i) \
    bit<256> v##i; \
    cells_g##i.read(v##i, meta.slot_index); \
    v##i = v##i | hdr.cells.g##i; \
    cells_g##i.write(meta.slot_index, v##i); \
    hdr.cells.g##i = v##i;

control Aggregation(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t std) {
    register<bit<SLOT_STATE_BITS>>(NUM_SLOT_COPIES) slot_state;
    FOR_EACH_GROUP(CELL_REGISTER)
    counter(NUM_EVENTS, CounterType.packets) event_counter;
    direct_counter(CounterType.packets_and_bytes) job_packets;
    direct_counter(CounterType.packets_and_bytes) worker_packets;

    action set_job(slot_index_t pool_base, bit<16> pool_size, bit<8> num_workers,
                   bit<16> mcast_grp) {
        meta.pool_base = pool_base;
        meta.pool_size = pool_size;
        meta.num_workers = num_workers;
        meta.mcast_grp = mcast_grp;
    }

    action unknown_job() {
        meta.drop_reason = DROP_UNKNOWN_JOB;
    }

    table job_table {
        key = { hdr.agg.job_id: exact; }
        actions = { set_job; @defaultonly unknown_job; }
        const default_action = unknown_job();
        counters = job_packets;
        size = MAX_JOBS;
    }

    action set_worker(port_t port, bit<32> worker_bit) {
        meta.worker_port = port;
        meta.worker_bit = worker_bit;
    }

    action unknown_rank() {
        meta.drop_reason = DROP_BAD_RANK;
    }

    table worker_table {
        key = { hdr.agg.job_id: exact; hdr.agg.rank: exact; }
        actions = { set_worker; @defaultonly unknown_rank; }
        const default_action = unknown_rank();
        counters = worker_packets;
        size = MAX_WORKERS;
    }

    /* A leaf of a two-level job: the port toward the parent, this leaf's rank in the
     * parent's job and the parent's service address. */
    action set_uplink(port_t port, bit<8> rank, ipv4_addr_t parent_ip, mac_addr_t parent_mac) {
        meta.has_uplink = 1;
        meta.uplink_port = port;
        meta.uplink_rank = rank;
        meta.parent_ip = parent_ip;
        meta.parent_mac = parent_mac;
    }

    table uplink {
        key = { hdr.agg.job_id: exact; }
        actions = { set_uplink; @defaultonly NoAction; }
        const default_action = NoAction();
        size = MAX_JOBS;
    }

    /* Classify the contribution against its slot copy and record it; one access to
     * the state register. Chunk numbers compare as serial numbers (RFC 1982). */
    action update_slot() {
        bit<SLOT_STATE_BITS> st;
        slot_state.read(st, meta.slot_index);
        job_id_t st_job = st[SLOT_STATE_JOB];
        chunk_t st_chunk = st[SLOT_STATE_CHUNK];
        bit<32> seen = st[SLOT_STATE_SEEN];
        bit<8> count = st[SLOT_STATE_COUNT];
        bit<8> exp = st[SLOT_STATE_EXP];
        chunk_t age = hdr.agg.chunk - st_chunk;
        bool other_job = st_job != hdr.agg.job_id;
        bool older = age[CHUNK_OLDER_BIT] == 1;
        bool fresh = other_job || (age != 0 && !older);
        bool combine = !fresh && !older && (seen & meta.worker_bit) == 0;
        bool complete = (count & SLOT_COUNT_MASK) == meta.num_workers;
        /* At a leaf, complete but without the parent's result: the partial goes up again. */
        bool up = meta.has_uplink == 1 && (count & SLOT_FINAL) == 0;
        meta.verdict = fresh ? VERDICT_FRESH
            : (older ? VERDICT_STALE
            : (combine ? VERDICT_COMBINE
            : (complete ? (up ? VERDICT_RESEND_UP : VERDICT_RESEND) : VERDICT_DUPLICATE)));
        job_id_t new_job = fresh ? hdr.agg.job_id : st_job;
        chunk_t new_chunk = fresh ? hdr.agg.chunk : st_chunk;
        bit<32> new_seen = fresh ? meta.worker_bit : (combine ? seen | meta.worker_bit : seen);
        bit<8> new_count = fresh ? 8w1 : (combine ? count + 1 : count);
        bit<8> new_exp = fresh ? hdr.agg.exp : (combine ? max_u8(exp, hdr.agg.exp) : exp);
        /* The fields in SLOT_STATE_* order, highest bits first. */
        slot_state.write(meta.slot_index, new_job ++ new_chunk ++ new_seen ++ new_count ++ new_exp);
        meta.count = new_count;
        hdr.agg.exp = new_exp;
    }

    /* A result from the parent for this leaf's copy: accepted (the copy becomes final and
     * keeps the parent's exponent; drop_reason stays NONE) when the copy holds this job's
     * chunk complete and not final; DUPLICATE when it is final already, else STALE. */
    action accept_result() {
        bit<SLOT_STATE_BITS> st;
        slot_state.read(st, meta.slot_index);
        job_id_t st_job = st[SLOT_STATE_JOB];
        chunk_t st_chunk = st[SLOT_STATE_CHUNK];
        bit<32> st_seen = st[SLOT_STATE_SEEN];
        bit<8> count = st[SLOT_STATE_COUNT];
        bit<8> st_exp = st[SLOT_STATE_EXP];
        bool same = st_job == hdr.agg.job_id && st_chunk == hdr.agg.chunk;
        bool final = (count & SLOT_FINAL) != 0;
        bool accept = same && !final && (count & SLOT_COUNT_MASK) == meta.num_workers;
        meta.drop_reason = accept ? DROP_NONE : (same && final ? DROP_DUPLICATE : DROP_STALE);
        bit<8> new_count = accept ? count | SLOT_FINAL : count;
        bit<8> new_exp = accept ? hdr.agg.exp : st_exp;
        slot_state.write(meta.slot_index, st_job ++ st_chunk ++ st_seen ++ new_count ++ new_exp);
    }

    /* A completed copy (or its re-send) leaves as one contribution to the parent, from
     * this leaf's service address (the contribution's destination) and uplink rank. */
    action to_parent() {
        hdr.agg.flags = 0;
        hdr.agg.rank = meta.uplink_rank;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = meta.parent_mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = meta.parent_ip;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.src_port = AGG_UDP_PORT;
        hdr.udp.dst_port = AGG_UDP_PORT;
        hdr.udp.checksum = 0;
        std.egress_spec = meta.uplink_port;
    }

    /* A result leaves to the job's group; to_delivery marks it as the aggregation's own,
     * the only kind of packet the egress delivers (a routed one may carry RESULT too). */
    action to_group() {
        hdr.agg.flags = AGG_FLAG_RESULT;
        std.mcast_grp = meta.mcast_grp;
        meta.to_delivery = 1;
    }

    /* A resent result goes back to the worker that asked for it. */
    action to_sender() {
        hdr.agg.flags = AGG_FLAG_RESULT | AGG_FLAG_RETX;
        std.egress_spec = std.ingress_port;
        meta.to_delivery = 1;
    }

    action store_cells() { FOR_EACH_GROUP(STORE_GROUP) }
    action load_cells() { FOR_EACH_GROUP(LOAD_GROUP) }
    action add_cells() { FOR_EACH_GROUP(ADD_GROUP) }
    action or_cells() { FOR_EACH_GROUP(OR_GROUP) }
    action max_cells() { FOR_EACH_GROUP(MAX_GROUP) }
    action add16_cells() { FOR_EACH_GROUP(ADD16_GROUP) }
    action add8_cells() { FOR_EACH_GROUP(ADD8_GROUP) }

    apply {
        if (!hdr.agg.isValid()) {
            /* Routed to the service address but not the aggregation protocol. */
            meta.drop_reason = DROP_BAD_HEADER;
        } else if (hdr.agg.version != AGG_VERSION || hdr.agg.shadow >= SHADOW_COPIES) {
            meta.drop_reason = DROP_BAD_HEADER;
        } else if (hdr.agg.ncells == 0 || hdr.agg.ncells > CELLS_PER_PKT
                || hdr.udp.length != AGG_UDP_LENGTH || hdr.ipv4.total_len != AGG_IPV4_LENGTH) {
            meta.drop_reason = DROP_BAD_LENGTH;
        } else if (hdr.agg.op < AGG_OP_ADD || hdr.agg.op > AGG_OP_LAST) {
            meta.drop_reason = DROP_BAD_OP;
        } else if (job_table.apply().hit) {
            meta.has_uplink = 0;
            uplink.apply();
            /* Never pool_base + slot in 32 bits: a job entry's pool_base near 2^32 would
             * wrap it round into another job's slots. */
            bool outside_pool = meta.pool_base >= NUM_SLOTS || hdr.agg.slot >= meta.pool_size
                || (slot_index_t)hdr.agg.slot >= NUM_SLOTS - meta.pool_base;
            /* Below NUM_SLOT_COPIES when inside: the shift is times SHADOW_COPIES. */
            meta.slot_index = ((meta.pool_base + (slot_index_t)hdr.agg.slot) << SHADOW_BITS)
                | (slot_index_t)hdr.agg.shadow;
            if ((hdr.agg.flags & AGG_FLAG_RESULT) != 0) {
                /* Only a leaf takes results, and only its parent's. */
                if (meta.has_uplink == 0) {
                    meta.drop_reason = DROP_BAD_HEADER;
                } else if (std.ingress_port != meta.uplink_port) {
                    meta.drop_reason = DROP_WRONG_PORT;
                } else if (hdr.agg.rank != meta.uplink_rank) {
                    meta.drop_reason = DROP_BAD_RANK;
                } else if (outside_pool) {
                    meta.drop_reason = DROP_SLOT_OUT_OF_POOL;
                } else {
                    accept_result();
                    if (meta.drop_reason == DROP_NONE) {
                        store_cells();
                        to_group();
                        event_counter.count(EVENT_RESULT);
                    }
                }
            } else if (worker_table.apply().hit) {
                if (meta.worker_port != std.ingress_port) {
                    meta.drop_reason = DROP_WRONG_PORT;
                } else if (outside_pool) {
                    meta.drop_reason = DROP_SLOT_OUT_OF_POOL;
                } else {
                    update_slot();
                    if (meta.verdict == VERDICT_FRESH) {
                        store_cells();
                    } else if (meta.verdict == VERDICT_COMBINE) {
                        if (hdr.agg.op == AGG_OP_ADD) {
                            add_cells();
                        } else if (hdr.agg.op == AGG_OP_ADD16) {
                            add16_cells();
                        } else if (hdr.agg.op == AGG_OP_ADD8) {
                            add8_cells();
                        } else if (hdr.agg.op == AGG_OP_OR) {
                            or_cells();
                        } else {
                            max_cells();
                        }
                    } else if (meta.verdict == VERDICT_RESEND
                            || meta.verdict == VERDICT_RESEND_UP) {
                        load_cells();
                    }

                    if (meta.verdict == VERDICT_FRESH || meta.verdict == VERDICT_COMBINE) {
                        event_counter.count(EVENT_CONTRIBUTION);
                        if (meta.count != meta.num_workers) {
                            meta.absorbed = 1;
                        } else if (meta.has_uplink == 1) {
                            to_parent();
                            event_counter.count(EVENT_PARTIAL);
                        } else {
                            to_group();
                            event_counter.count(EVENT_RESULT);
                        }
                    } else if (meta.verdict == VERDICT_RESEND_UP) {
                        to_parent();
                        hdr.agg.flags = AGG_FLAG_RETX;
                        event_counter.count(EVENT_PARTIAL);
                    } else if (meta.verdict == VERDICT_RESEND) {
                        to_sender();
                        event_counter.count(EVENT_RESENT);
                    } else if (meta.verdict == VERDICT_DUPLICATE) {
                        meta.drop_reason = DROP_DUPLICATE;
                    } else {
                        meta.drop_reason = DROP_STALE;
                    }
                }
            }
        }
    }
}
