/* The slot state of a slot copy, in the dependency order of the stages (docs/tofino.md):
 *   slot_owner, slot_chunk -> how this packet's round relates to the copy's round
 *   slot_seen              -> whether this worker has contributed to it
 *   slot_count             -> contributions so far (and the exponent, its hi word).
 * Each register has one table whose actions pick its register action, so each is read
 * and written once per pass. The data plane resets itself as in v1model: a fresh round
 * overwrites, so no register ever needs a control-plane write. */
#include "headers.p4"

/* The register index of the packet's slot copy: shadow * NUM_SLOTS + pool_base + slot. */
#define SLOT_COPY(h) h.get({hdr.agg.shadow[0:0], meta.slot_sum[11:0]})

struct chunk_tag_t {
    bit<32> chunk;
    bit<32> job;
}

struct count_exp_t {
    bit<8> count;
    bit<8> exp;
}

/* First stage: the owner (the job that wrote the copy last) and the copy's chunk, side
 * by side. The chunk register keeps its own copy of the job, so it knows a fresh round
 * (another job, or a newer chunk in serial order) without reading slot_owner. */
control RoundState(inout ingress_headers_t hdr, inout ingress_metadata_t meta) {
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) owner_index;
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) chunk_index;

    Register<bit<16>, slot_copy_t>(NUM_SLOT_COPIES, 0) slot_owner;
    RegisterAction<bit<16>, slot_copy_t, bit<16>>(slot_owner) swap_owner = {
        void apply(inout bit<16> v, out bit<16> rv) { rv = v; v = hdr.agg.job_id; }
    };

    Register<chunk_tag_t, slot_copy_t>(NUM_SLOT_COPIES, {0, 0}) slot_chunk;
    RegisterAction<chunk_tag_t, slot_copy_t, bit<32>>(slot_chunk) advance_chunk = {
        void apply(inout chunk_tag_t v, out bit<32> rv) {
            rv = v.chunk;
            if (v.job != (bit<32>)hdr.agg.job_id || (int<32>)(hdr.agg.chunk - v.chunk) > 0) {
                v.chunk = hdr.agg.chunk;
                v.job = (bit<32>)hdr.agg.job_id;
            }
        }
    };

    action take_owner() {
        meta.owner_diff = swap_owner.execute(SLOT_COPY(owner_index)) ^ hdr.agg.job_id;
    }

    action take_chunk() {
        meta.age = hdr.agg.chunk - advance_chunk.execute(SLOT_COPY(chunk_index));
    }

    table owner_table {
        actions = { take_owner; }
        const default_action = take_owner();
        size = 1;
    }

    table chunk_table {
        actions = { take_chunk; }
        const default_action = take_chunk();
        size = 1;
    }

    apply {
        owner_table.apply();
        chunk_table.apply();
    }
}

/* Second stage: the round's verdict (fresh, same round, older) from the owner and the
 * age, and the seen bitmap: set anew for a fresh round, or-ed for the same round (its
 * old bits & worker_bit: nonzero when this worker has contributed already). */
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

    /* Fresh: another job (owner_diff != 0), or a newer chunk (age != 0, sign bit 0).
     * A chunk exactly 2^31 ahead is older, as in v1model. */
    table seen_table {
        key = {
            meta.owner_diff: ternary;
            meta.age: ternary;
        }
        actions = { fresh_round; same_round; older_round; }
        const entries = {
            (0, 0): same_round();
            (0, 0x80000000 &&& 0x80000000): older_round();
        }
        const default_action = fresh_round();
        size = 2;
    }

    apply {
        seen_table.apply();
    }
}

/* Third stage, beside the first cells: the count of contributions and the exponent (MAX
 * whatever the op). The count is returned in the contribution's pass; the exponent is
 * read by a harvest pass, which is the one that delivers the result. */
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
    RegisterAction<count_exp_t, slot_copy_t, bit<8>>(slot_count) read_count = {
        void apply(inout count_exp_t v, out bit<8> rv) { rv = v.count; }
    };
    RegisterAction<count_exp_t, slot_copy_t, bit<8>>(slot_count) read_exp = {
        void apply(inout count_exp_t v, out bit<8> rv) { rv = v.exp; }
    };

    action count_first() { meta.count = first_count.execute(SLOT_COPY(count_index)); }
    action count_more() { meta.count = add_count.execute(SLOT_COPY(count_index)); }
    action count_seen() { meta.count = read_count.execute(SLOT_COPY(count_index)); }
    action exp_result() { hdr.agg.exp = read_exp.execute(SLOT_COPY(count_index)); }

    table count_table {
        key = {
            meta.phase: ternary;
            meta.seen_before: ternary;
        }
        actions = { count_first; count_more; count_seen; exp_result; NoAction; }
        const entries = {
            (VERDICT_FRESH, _): count_first();
            (VERDICT_COMBINE, 0): count_more();
            (VERDICT_COMBINE, _): count_seen();
            (HARVEST_LO_LAST, _): exp_result();
            (HARVEST_HI_LAST, _): exp_result();
        }
        const default_action = NoAction();
        size = 8;
    }

    apply {
        count_table.apply();
    }
}
