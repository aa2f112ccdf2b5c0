/* The cells, two per register entry (pair p: cells 2p in lo, 2p+1 in hi), one table per
 * register. A stateful ALU keeps four register actions and returns one 32-bit word, so
 * a pass returns one half of every pair; a harvest pass (recirculated) returns the other:
 *   store, add, or: write both halves, return hi      max: combine both, return lo
 * Reads reuse them with neutral inputs (MAX with INT32_MIN, OR with 0): a pass that
 * returns one half sets the other half's cell to the neutral input of the harvest's read,
 * and the half it returns is its own neutral input there (x MAX x = x OR x = x).
 *   contribution, fresh             store    -> harvest HARVEST_LO_LAST (max)
 *   same round, new worker, ADD/OR  add/or   -> HARVEST_LO_LAST (max)
 *   same round, new worker, MAX     max      -> HARVEST_HI_LAST (or)
 *   same round, worker seen         none: both cells neutral for max -> HARVEST_LO_MORE
 *                                   (max, then or) when the round is complete (a resend).
 *   a parent's result, accepted     store in its second pass (HARVEST_STORE), the packet
 *                                   keeps its cells: it is the result. */
#include "headers.p4"

struct cell_pair_t {
    int<32> lo;
    int<32> hi;
}

#define PAIR_INDEX(p) index##p.get({hdr.agg.shadow[0:0], meta.slot_sum[11:0]})
#define CELL_PAIR(p, a, b) \
    Hash<slot_copy_t>(HashAlgorithm_t.IDENTITY) index##p; \
    Register<cell_pair_t, slot_copy_t>(NUM_SLOT_COPIES, {0, 0}) pair##p; \
    RegisterAction<cell_pair_t, slot_copy_t, bit<32>>(pair##p) store##p = { \
        void apply(inout cell_pair_t v, out bit<32> rv) { \
            v.lo = (int<32>)hdr.cells.c##a; \
            v.hi = (int<32>)hdr.cells.c##b; \
            rv = (bit<32>)v.hi; } }; \
    RegisterAction<cell_pair_t, slot_copy_t, bit<32>>(pair##p) add##p = { \
        void apply(inout cell_pair_t v, out bit<32> rv) { \
            v.lo = v.lo + (int<32>)hdr.cells.c##a; \
            v.hi = v.hi + (int<32>)hdr.cells.c##b; \
            rv = (bit<32>)v.hi; } }; \
    RegisterAction<cell_pair_t, slot_copy_t, bit<32>>(pair##p) or##p = { \
        void apply(inout cell_pair_t v, out bit<32> rv) { \
            v.lo = v.lo | (int<32>)hdr.cells.c##a; \
            v.hi = v.hi | (int<32>)hdr.cells.c##b; \
            rv = (bit<32>)v.hi; } }; \
    RegisterAction<cell_pair_t, slot_copy_t, bit<32>>(pair##p) max##p = { \
        void apply(inout cell_pair_t v, out bit<32> rv) { \
            v.lo = max(v.lo, (int<32>)hdr.cells.c##a); \
            v.hi = max(v.hi, (int<32>)hdr.cells.c##b); \
            rv = (bit<32>)v.lo; } }; \
    action store_pair##p() { \
        hdr.cells.c##b = store##p.execute(PAIR_INDEX(p)); hdr.cells.c##a = NEUTRAL_MAX; } \
    action add_pair##p() { \
        hdr.cells.c##b = add##p.execute(PAIR_INDEX(p)); hdr.cells.c##a = NEUTRAL_MAX; } \
    action or_pair##p() { \
        hdr.cells.c##b = or##p.execute(PAIR_INDEX(p)); hdr.cells.c##a = NEUTRAL_MAX; } \
    action max_pair##p() { \
        hdr.cells.c##a = max##p.execute(PAIR_INDEX(p)); hdr.cells.c##b = NEUTRAL_OR; } \
    action hold_pair##p() { hdr.cells.c##a = NEUTRAL_MAX; hdr.cells.c##b = NEUTRAL_MAX; } \
    action keep_pair##p() { store##p.execute(PAIR_INDEX(p)); } \
    action read_lo##p() { hdr.cells.c##a = max##p.execute(PAIR_INDEX(p)); } \
    action read_lo_more##p() { \
        hdr.cells.c##a = max##p.execute(PAIR_INDEX(p)); hdr.cells.c##b = NEUTRAL_OR; } \
    action read_hi##p() { hdr.cells.c##b = or##p.execute(PAIR_INDEX(p)); } \
    table pair##p##_table { \
        key = { meta.phase: ternary; meta.seen_before: ternary; hdr.agg.op[1:0]: ternary; } \
        actions = { store_pair##p; add_pair##p; or_pair##p; max_pair##p; hold_pair##p; \
                    keep_pair##p; read_lo##p; read_lo_more##p; read_hi##p; NoAction; } \
        const entries = { \
            (VERDICT_FRESH, _, _): store_pair##p(); \
            (VERDICT_COMBINE, 0, (bit<2>)AGG_OP_ADD): add_pair##p(); \
            (VERDICT_COMBINE, 0, (bit<2>)AGG_OP_OR): or_pair##p(); \
            (VERDICT_COMBINE, 0, (bit<2>)AGG_OP_MAX): max_pair##p(); \
            (VERDICT_COMBINE, _, _): hold_pair##p(); \
            (HARVEST_LO_LAST, _, _): read_lo##p(); \
            (HARVEST_LO_MORE, _, _): read_lo_more##p(); \
            (HARVEST_HI_LAST, _, _): read_hi##p(); \
            (HARVEST_STORE, _, _): keep_pair##p(); \
        } \
        const default_action = NoAction(); \
        size = 9; \
    }
#define APPLY_PAIR(p, a, b) pair##p##_table.apply();

control CellPairs(inout ingress_headers_t hdr, inout ingress_metadata_t meta) {
    FOR_EACH_PAIR(CELL_PAIR)

    apply {
        FOR_EACH_PAIR(APPLY_PAIR)
    }
}
