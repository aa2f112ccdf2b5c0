/* Aggregation in TNA: the same classification and combination as p4src/aggregation.p4,
 * with the v1model program's 96-bit slot state split into registers that each take one
 * stateful-ALU access per packet, in dependency order:
 *   slot_owner, slot_chunk  -> verdict of the round (fresh, same round, older round)
 *   slot_seen               -> has this worker contributed (combine or not)
 *   slot_count, slot_exp, cells -> written, combined or read back.
 * The data plane resets itself as in v1model: a fresh round overwrites, so no register
 * ever needs a control-plane write. */
#include "headers.p4"

#define CELL_REGISTERS(i) \
    Register<int<32>, slot_copy_t>(NUM_SLOT_COPIES, 0) cells_c##i; \
    RegisterAction<int<32>, slot_copy_t, bit<32>>(cells_c##i) store_c##i = { \
        void apply(inout int<32> v, out bit<32> rv) { \
            v = (int<32>)hdr.cells.c##i; rv = (bit<32>)v; } }; \
    RegisterAction<int<32>, slot_copy_t, bit<32>>(cells_c##i) add_c##i = { \
        void apply(inout int<32> v, out bit<32> rv) { \
            v = v + (int<32>)hdr.cells.c##i; rv = (bit<32>)v; } }; \
    RegisterAction<int<32>, slot_copy_t, bit<32>>(cells_c##i) or_c##i = { \
        void apply(inout int<32> v, out bit<32> rv) { \
            v = v | (int<32>)hdr.cells.c##i; rv = (bit<32>)v; } }; \
    RegisterAction<int<32>, slot_copy_t, bit<32>>(cells_c##i) max_c##i = { \
        void apply(inout int<32> v, out bit<32> rv) { \
            if ((int<32>)hdr.cells.c##i > v) { v = (int<32>)hdr.cells.c##i; } \
            rv = (bit<32>)v; } };
#define STORE_CELL(i) hdr.cells.c##i = store_c##i.execute(meta.slot_index);
#define ADD_CELL(i) hdr.cells.c##i = add_c##i.execute(meta.slot_index);
#define OR_CELL(i) hdr.cells.c##i = or_c##i.execute(meta.slot_index);
#define MAX_CELL(i) hdr.cells.c##i = max_c##i.execute(meta.slot_index);
/* A stateful ALU holds at most four register actions: a resend reads the cells back as
 * `v | 0` (the cells are zeroed first), so no fifth "read" action is needed. */
#define ZERO_CELL(i) hdr.cells.c##i = 0;

struct tag_t {
    bit<32> chunk;
    bit<32> job;
}

control Aggregation(inout ingress_headers_t hdr, inout ingress_metadata_t meta,
                    in ingress_intrinsic_metadata_t ig_intr_md,
                    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Counter<bit<64>, bit<2>>(NUM_EVENTS, CounterType_t.PACKETS) event_counter;
    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) job_packets;
    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) worker_packets;

    action set_job(bit<12> pool_base, bit<16> pool_size, bit<8> num_workers,
                   bit<16> mcast_grp) {
        job_packets.count();
        meta.pool_base = pool_base;
        meta.pool_size = pool_size;
        meta.num_workers = num_workers;
        meta.mcast_grp = mcast_grp;
    }

    action unknown_job() {
        job_packets.count();
        meta.drop_reason = DROP_UNKNOWN_JOB;
    }

    table job_table {
        key = { hdr.agg.job_id: exact; }
        actions = { set_job; @defaultonly unknown_job; }
        const default_action = unknown_job();
        counters = job_packets;
        size = MAX_JOBS;
    }

    action set_worker(PortId_t port, bit<32> worker_bit) {
        worker_packets.count();
        meta.worker_port = port;
        meta.worker_bit = worker_bit;
    }

    action unknown_rank() {
        worker_packets.count();
        meta.drop_reason = DROP_BAD_RANK;
    }

    table worker_table {
        key = { hdr.agg.job_id: exact; hdr.agg.rank: exact; }
        actions = { set_worker; @defaultonly unknown_rank; }
        const default_action = unknown_rank();
        counters = worker_packets;
        size = MAX_WORKERS;
    }

    /* The owner is written on every access: a packet of another job makes the round
     * fresh and takes the slot copy; one of the same job writes what is there. */
    Register<bit<32>, slot_copy_t>(NUM_SLOT_COPIES, 0) slot_owner;
    RegisterAction<bit<32>, slot_copy_t, bit<32>>(slot_owner) swap_owner = {
        void apply(inout bit<32> v, out bit<32> rv) { rv = v; v = meta.job; }
    };

    /* The round's chunk, tagged with the job so the write below knows a fresh round
     * (another job, or a newer chunk in serial order) without a second access. */
    Register<tag_t, slot_copy_t>(NUM_SLOT_COPIES, {0, 0}) slot_chunk;
    RegisterAction<tag_t, slot_copy_t, bit<32>>(slot_chunk) advance_chunk = {
        void apply(inout tag_t v, out bit<32> rv) {
            rv = v.chunk;
            if (v.job != meta.job || (int<32>)(hdr.agg.chunk - v.chunk) > 0) {
                v.chunk = hdr.agg.chunk;
                v.job = meta.job;
            }
        }
    };

    Register<bit<32>, slot_copy_t>(NUM_SLOT_COPIES, 0) slot_seen;
    RegisterAction<bit<32>, slot_copy_t, bit<32>>(slot_seen) first_seen = {
        void apply(inout bit<32> v, out bit<32> rv) { rv = 0; v = meta.worker_bit; }
    };
    RegisterAction<bit<32>, slot_copy_t, bit<32>>(slot_seen) add_seen = {
        void apply(inout bit<32> v, out bit<32> rv) { rv = v; v = v | meta.worker_bit; }
    };

    Register<bit<8>, slot_copy_t>(NUM_SLOT_COPIES, 0) slot_count;
    RegisterAction<bit<8>, slot_copy_t, bit<8>>(slot_count) first_count = {
        void apply(inout bit<8> v, out bit<8> rv) { v = 1; rv = v; }
    };
    RegisterAction<bit<8>, slot_copy_t, bit<8>>(slot_count) add_count = {
        void apply(inout bit<8> v, out bit<8> rv) { v = v + 1; rv = v; }
    };
    RegisterAction<bit<8>, slot_copy_t, bit<8>>(slot_count) read_count = {
        void apply(inout bit<8> v, out bit<8> rv) { rv = v; }
    };

    Register<bit<8>, slot_copy_t>(NUM_SLOT_COPIES, 0) slot_exp;
    RegisterAction<bit<8>, slot_copy_t, bit<8>>(slot_exp) store_exp = {
        void apply(inout bit<8> v, out bit<8> rv) { v = hdr.agg.exp; rv = v; }
    };
    RegisterAction<bit<8>, slot_copy_t, bit<8>>(slot_exp) max_exp = {
        void apply(inout bit<8> v, out bit<8> rv) {
            if (hdr.agg.exp > v) { v = hdr.agg.exp; }
            rv = v;
        }
    };
    RegisterAction<bit<8>, slot_copy_t, bit<8>>(slot_exp) read_exp = {
        void apply(inout bit<8> v, out bit<8> rv) { rv = v; }
    };

    FOR_EACH_CELL(CELL_REGISTERS)

    action index_slot() {
        meta.slot_sum = (bit<16>)meta.pool_base + hdr.agg.slot;
        meta.job = (bit<32>)hdr.agg.job_id;
    }

    action copy_index() {
        meta.slot_index = (slot_copy_t)(meta.slot_sum << 1) | (slot_copy_t)hdr.agg.shadow;
    }

    action zero_cells() { FOR_EACH_CELL(ZERO_CELL) }

    apply {
        if (!hdr.agg.isValid()) {
            meta.drop_reason = DROP_BAD_HEADER;
        } else if (hdr.agg.version != AGG_VERSION || hdr.agg.shadow > 1
                || (hdr.agg.flags & AGG_FLAG_RESULT) != 0) {
            meta.drop_reason = DROP_BAD_HEADER;
        } else if (hdr.agg.ncells == 0 || hdr.agg.ncells > CELLS_PER_PKT
                || hdr.udp.length != AGG_UDP_LENGTH || hdr.ipv4.total_len != AGG_IPV4_LENGTH) {
            meta.drop_reason = DROP_BAD_LENGTH;
        } else if (hdr.agg.op < AGG_OP_ADD || hdr.agg.op > AGG_OP_MAX) {
            meta.drop_reason = DROP_BAD_OP;
        } else if (job_table.apply().hit) {
            if (worker_table.apply().hit) {
                index_slot();
                if (meta.worker_port != ig_intr_md.ingress_port) {
                    meta.drop_reason = DROP_WRONG_PORT;
                } else if (hdr.agg.slot >= meta.pool_size || meta.slot_sum >= NUM_SLOTS) {
                    /* pool_base < 2^12 and slot < 2^16: their sum cannot wrap 16 bits. */
                    meta.drop_reason = DROP_SLOT_OUT_OF_POOL;
                } else {
                    copy_index();
                    meta.old_owner = swap_owner.execute(meta.slot_index);
                    meta.old_chunk = advance_chunk.execute(meta.slot_index);
                    meta.age = hdr.agg.chunk - meta.old_chunk;
                    if (meta.old_owner != meta.job
                            || (meta.age != 0 && meta.age[31:31] == 0)) {
                        meta.verdict = VERDICT_FRESH;
                    } else if (meta.age != 0) {
                        meta.verdict = VERDICT_STALE;
                    } else {
                        meta.verdict = VERDICT_COMBINE;  /* or a worker seen: below */
                    }
                    if (meta.verdict == VERDICT_FRESH) {
                        first_seen.execute(meta.slot_index);
                    } else if (meta.verdict == VERDICT_COMBINE) {
                        meta.old_seen = add_seen.execute(meta.slot_index);
                        meta.seen_before = meta.old_seen & meta.worker_bit;
                        if (meta.seen_before != 0) {
                            meta.verdict = VERDICT_DUPLICATE;  /* or a resend: below */
                        }
                    }
                    if (meta.verdict == VERDICT_FRESH) {
                        meta.count = first_count.execute(meta.slot_index);
                        hdr.agg.exp = store_exp.execute(meta.slot_index);
                        FOR_EACH_CELL(STORE_CELL)
                    } else if (meta.verdict == VERDICT_COMBINE) {
                        meta.count = add_count.execute(meta.slot_index);
                        hdr.agg.exp = max_exp.execute(meta.slot_index);
                        if (hdr.agg.op == AGG_OP_ADD) {
                            FOR_EACH_CELL(ADD_CELL)
                        } else if (hdr.agg.op == AGG_OP_OR) {
                            FOR_EACH_CELL(OR_CELL)
                        } else {
                            FOR_EACH_CELL(MAX_CELL)
                        }
                    } else if (meta.verdict == VERDICT_DUPLICATE) {
                        meta.count = read_count.execute(meta.slot_index);
                        hdr.agg.exp = read_exp.execute(meta.slot_index);
                        zero_cells();
                        FOR_EACH_CELL(OR_CELL)
                        if (meta.count == meta.num_workers) {
                            meta.verdict = VERDICT_RESEND;
                        }
                    }

                    if (meta.verdict == VERDICT_FRESH || meta.verdict == VERDICT_COMBINE) {
                        event_counter.count((bit<2>)EVENT_CONTRIBUTION);
                        if (meta.count == meta.num_workers) {
                            hdr.agg.flags = AGG_FLAG_RESULT;
                            ig_tm_md.mcast_grp_a = meta.mcast_grp;
                            event_counter.count((bit<2>)EVENT_RESULT);
                        } else {
                            meta.absorbed = 1;
                        }
                    } else if (meta.verdict == VERDICT_RESEND) {
                        hdr.agg.flags = AGG_FLAG_RESULT | AGG_FLAG_RETX;
                        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
                        event_counter.count((bit<2>)EVENT_RESENT);
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
