/* The slot state of a slot copy, in the dependency order of the stages (docs/tofino.md):
 *   slot_round, slot_round_twin -> how this packet's round relates to the copy's round
 *   slot_seen                   -> whether this worker has contributed to it
 *   slot_count                  -> contributions so far (and the exponent, its hi word);
 *                                  its top bit, SLOT_FINAL, set at a leaf of a two-level
 *                                  job when the parent's result is stored in the copy.
 * A result from the parent reads slot_round (the same round?) and writes only slot_count
 * (accept_result) and, in its second pass, the cells.
 * Each register has one table whose actions pick its register action, so each is read
 * and written once per pass. The data plane resets itself as in v1model: a fresh round
 * overwrites, so no register ever needs a control-plane write. */
#include "headers.p4"

/* The register index of the packet's slot copy: shadow * NUM_SLOTS + pool_base + slot. */
#define SLOT_COPY(h) h.get({hdr.agg.shadow[0:0], meta.slot_sum[11:0]})

/* The round of a slot copy: the job that wrote it last and its chunk. */
struct round_tag_t {
    bit<32> chunk;
    bit<32> job;
}

struct count_exp_t {
    bit<8> count;
    bit<8> exp;
}

/* First stage: the round's verdict. It takes three comparisons with the copy's round
 * (another job; a newer chunk; an older one), and a Tofino 1 stateful ALU has two, so
 * two registers hold the same round tag side by side and each answers one question with
 * a flag from its comparisons' predicate (bf-p4c cannot subtract an ALU's output in an
 * action, so no age leaves the ALU). Both take the packet's tag when it is another job's
 * or not older; for an equal chunk that rewrites what is there, so they never differ.
 * Serial order of chunks as RFC 1982: a chunk exactly 2^31 ahead is older, as in v1model. */
control RoundState(inout ingress_headers_t hdr, inout ingress_metadata_t meta) {
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) round_index;
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) twin_index;

    Register<round_tag_t, slot_copy_t>(NUM_SLOT_COPIES, {0, 0}) slot_round;
    /* 1 for a fresh round: another job's copy, or a newer chunk of this job. */
    RegisterAction<round_tag_t, slot_copy_t, bit<8>>(slot_round) check_fresh = {
        void apply(inout round_tag_t v, out bit<8> rv) {
            rv = 0;
            if (v.job != (bit<32>)hdr.agg.job_id || (int<32>)(hdr.agg.chunk - v.chunk) > 0) {
                v.chunk = hdr.agg.chunk;
                v.job = (bit<32>)hdr.agg.job_id;
                rv = 1;
            }
        }
    };

    Register<round_tag_t, slot_copy_t>(NUM_SLOT_COPIES, {0, 0}) slot_round_twin;
    /* 1 for an older round: this job's copy, and an older chunk. */
    RegisterAction<round_tag_t, slot_copy_t, bit<8>>(slot_round_twin) check_stale = {
        void apply(inout round_tag_t v, out bit<8> rv) {
            if (v.job != (bit<32>)hdr.agg.job_id || (int<32>)(hdr.agg.chunk - v.chunk) >= 0) {
                v.chunk = hdr.agg.chunk;
                v.job = (bit<32>)hdr.agg.job_id;
                rv = 0;
            } else {
                rv = 1;
            }
        }
    };

    /* A result from the parent: 1 when the copy holds its job and chunk; the copy's round
     * is left as it is. */
    RegisterAction<round_tag_t, slot_copy_t, bit<8>>(slot_round) check_same = {
        void apply(inout round_tag_t v, out bit<8> rv) {
            rv = 0;
            if (v.job == (bit<32>)hdr.agg.job_id && v.chunk == hdr.agg.chunk) {
                rv = 1;
            }
        }
    };

    /* Admitted: the copy's state is this packet's to read and write from here on. */
    action admit() {
        meta.admitted = 1;
        meta.final_count = meta.num_workers | SLOT_FINAL;
    }

    action take_round() {
        meta.fresh = check_fresh.execute(SLOT_COPY(round_index));
        admit();
    }

    action take_result() {
        meta.fresh = check_same.execute(SLOT_COPY(round_index));
        admit();
    }

    action take_twin() { meta.stale = check_stale.execute(SLOT_COPY(twin_index)); }

    /* The last step of the admission, as keys: a contribution (RESULT clear) from its
     * worker's port takes the round, a result through the uplink from the parent's rank
     * only reads it; anything else is not admitted. The twin is a contribution's alone. */
    table round_table {
        key = {
            hdr.agg.flags: ternary;
            meta.port_diff: ternary;
            meta.uplink_port_diff: ternary;
            meta.uplink_rank_diff: ternary;
        }
        actions = { take_round; take_result; NoAction; }
        const entries = {
            (0 &&& AGG_FLAG_RESULT, 0, _, _): take_round();
            (AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, _, 0, 0): take_result();
        }
        const default_action = NoAction();
        size = 2;
    }

    table twin_table {
        key = {
            hdr.agg.flags: ternary;
            meta.port_diff: ternary;
        }
        actions = { take_twin; NoAction; }
        const entries = {
            (0 &&& AGG_FLAG_RESULT, 0): take_twin();
        }
        const default_action = NoAction();
        size = 1;
    }

    apply {
        round_table.apply();
        twin_table.apply();
    }
}

/* Second stage: the round's verdict (fresh, same round, older) from the two flags, and
 * the seen bitmap: set anew for a fresh round, or-ed for the same round (its
 * old bits & worker_bit: nonzero when this worker has contributed already). A result from
 * the parent touches no bitmap: for the copy's round it goes on to slot_count
 * (PARENT_RESULT), for another it is stale. */
control SeenState(inout ingress_headers_t hdr, inout ingress_metadata_t meta) {
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) seen_index;

    Register<bit<32>, slot_copy_t>(NUM_SLOT_COPIES, 0) slot_seen;
    RegisterAction<bit<32>, slot_copy_t, bit<32>>(slot_seen) first_seen = {
        void apply(inout bit<32> v) { v = meta.worker_bit; }
    };
    RegisterAction<bit<32>, slot_copy_t, bit<32>>(slot_seen) add_seen = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v & meta.worker_bit;
            v = v | meta.worker_bit;
        }
    };

    action fresh_round() {
        first_seen.execute(SLOT_COPY(seen_index));
        meta.phase = VERDICT_FRESH;
    }

    action same_round() {
        meta.seen_before = add_seen.execute(SLOT_COPY(seen_index));
        meta.phase = VERDICT_COMBINE;
    }

    action older_round() {
        meta.phase = VERDICT_STALE;
    }

    action result_round() {
        meta.phase = PARENT_RESULT;
        meta.accept_count = meta.num_workers;
    }

    table seen_table {
        key = {
            hdr.agg.flags: ternary;
            meta.fresh: ternary;
            meta.stale: ternary;
        }
        actions = { fresh_round; same_round; older_round; result_round; }
        /* Every action that touches a register is an entry: a miss cannot use the hash
         * unit that indexes it. The two flags are never both 1. */
        const entries = {
            (0 &&& AGG_FLAG_RESULT, 1, 0): fresh_round();
            (0 &&& AGG_FLAG_RESULT, 0, 0): same_round();
            (0 &&& AGG_FLAG_RESULT, 0, 1): older_round();
            (AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 1, 0): result_round();
        }
        const default_action = older_round();
        size = 4;
    }

    apply {
        seen_table.apply();
    }
}

/* Third stage, beside the first cells: the count of contributions and the exponent (MAX
 * whatever the op). The count is returned in the contribution's pass (with SLOT_FINAL:
 * a copy's count is num_workers | SLOT_FINAL once the parent's result is in); the
 * exponent is read by a harvest pass, which is the one that delivers the result. A
 * result from the parent for the copy's round is accepted here (v1model's accept_result):
 * complete (count == num_workers) and not final, the copy becomes final and takes the
 * result's exponent; the count before is returned, so that the outcome tells an accepted
 * result (num_workers) from a duplicate (num_workers | SLOT_FINAL) and a stale one. */
control CountState(inout ingress_headers_t hdr, inout ingress_metadata_t meta) {
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) count_index;

    Register<count_exp_t, slot_copy_t>(NUM_SLOT_COPIES, {0, 0}) slot_count;
    RegisterAction<count_exp_t, slot_copy_t, bit<8>>(slot_count) first_count = {
        void apply(inout count_exp_t v, out bit<8> rv) {
            v.count = 1;
            v.exp = hdr.agg.exp;
            rv = v.count;
        }
    };
    RegisterAction<count_exp_t, slot_copy_t, bit<8>>(slot_count) add_count = {
        void apply(inout count_exp_t v, out bit<8> rv) {
            v.count = v.count + 1;
            v.exp = max(v.exp, hdr.agg.exp);
            rv = v.count;
        }
    };
    RegisterAction<count_exp_t, slot_copy_t, bit<8>>(slot_count) read_exp = {
        void apply(inout count_exp_t v, out bit<8> rv) { rv = v.exp; }
    };

    /* A duplicate contribution's read of the count and a parent's result's accept_result
     * in one register action (Tofino allows four per register): the copy becomes final
     * only when its count is meta.accept_count, which is num_workers for a result and 0
     * for a duplicate (whose own contribution is counted, so the count is never 0). The
     * count before is returned either way. */
    RegisterAction<count_exp_t, slot_copy_t, bit<8>>(slot_count) read_or_final = {
        void apply(inout count_exp_t v, out bit<8> rv) {
            rv = v.count;
            if (v.count == meta.accept_count) {
                v.count = v.count | SLOT_FINAL;
                v.exp = hdr.agg.exp;
            }
        }
    };

    action count_first() { meta.count = first_count.execute(SLOT_COPY(count_index)); }
    action count_more() { meta.count = add_count.execute(SLOT_COPY(count_index)); }
    action count_seen() { meta.count = read_or_final.execute(SLOT_COPY(count_index)); }
    action exp_result() { hdr.agg.exp = read_exp.execute(SLOT_COPY(count_index)); }
    action accept_result() { meta.count = read_or_final.execute(SLOT_COPY(count_index)); }

    table count_table {
        key = {
            meta.phase: ternary;
            meta.seen_before: ternary;
        }
        actions = { count_first; count_more; count_seen; exp_result; accept_result; NoAction; }
        const entries = {
            (VERDICT_FRESH, _): count_first();
            (VERDICT_COMBINE, 0): count_more();
            (VERDICT_COMBINE, _): count_seen();
            (HARVEST_LO_LAST, _): exp_result();
            (HARVEST_HI_LAST, _): exp_result();
            (PARENT_RESULT, _): accept_result();
        }
        const default_action = NoAction();
        size = 8;
    }

    apply {
        count_table.apply();
    }
}
