/* Aggregation in TNA: the same checks, verdicts and combination as p4src/aggregation.p4,
 * two-level aggregation included, laid out for Tofino's stages (docs/tofino.md):
 *   stage 0   the header checks, job_table, worker_table and uplink, beside forwarding's
 *   stage 1   the admission (every check passed; round_table's keys: the port) and the
 *             round (slot_round, its twin)
 *   stage 2   the verdict and the seen bitmap
 *   stage 3   the count and exponent, the refusals (refusal), harvest_send; then the outcome
 *   stage 3+  the cell pairs, four a stage where nothing else has a stateful ALU.
 * A completed round, or a resend, is recirculated once (twice for a resend) through the
 * pipe's recirculation port to read the halves of the cell pairs the first pass did not
 * return; the last of those passes sends the result (at a leaf of a two-level job: the
 * partial, up to the parent). A result from the parent, accepted in its first pass, is
 * stored in a second and goes on from there to the job's group as it is. */
#include "headers.p4"
#include "slot_state.p4"
#include "cell_pairs.p4"

control Aggregation(inout ingress_headers_t hdr, inout ingress_metadata_t meta,
                    in ingress_intrinsic_metadata_t ig_intr_md,
                    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Counter<bit<64>, bit<2>>(NUM_EVENTS, CounterType_t.PACKETS) event_counter;
    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) job_packets;
    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) worker_packets;
    RoundState() round_state;
    SeenState() seen_state;
    CountState() count_state;
    CellPairs() cells;

    /* pool_base + slot and pool_size - slot, computed here so that stage 1 only
     * compares: with pool_base's and the slot's high bits checked to be 0 there, both
     * operands are below 2^12 and the 16-bit sum cannot wrap. (A bit<12> pool_base,
     * zero-extended in the sum, is an expression bf-p4c's action analysis rejects.) */
    action set_job(bit<16> pool_base, bit<16> pool_size, bit<8> num_workers,
                   bit<16> mcast_grp) {
        job_packets.count();
        meta.slot_sum = pool_base + hdr.agg.slot;
        meta.base_high = pool_base[15:12];
        meta.room = pool_size - hdr.agg.slot;
        meta.num_workers = num_workers;
        meta.mcast_grp = mcast_grp;
    }

    action unknown_job() {
        job_packets.count();
        meta.job_miss = 1;
    }

    table job_table {
        key = { hdr.agg.job_id: exact; }
        actions = { set_job; @defaultonly unknown_job; }
        const default_action = unknown_job();
        counters = job_packets;
        size = MAX_JOBS;
    }

    action set_worker(sdn_port_t port, bit<32> worker_bit) {
        worker_packets.count();
        meta.port_diff = (bit<9>)port ^ ig_intr_md.ingress_port;
        meta.worker_bit = worker_bit;
    }

    action unknown_rank() {
        worker_packets.count();
        meta.rank_miss = 1;
        meta.port_diff = 0x1ff;  /* not admitted: one check there for both */
    }

    table worker_table {
        key = { hdr.agg.job_id: exact; hdr.agg.rank: exact; }
        actions = { set_worker; @defaultonly unknown_rank; }
        const default_action = unknown_rank();
        counters = worker_packets;
        size = MAX_WORKERS;
    }

    /* A leaf of a two-level job: the port toward the parent, this leaf's rank in the
     * parent's job and the parent's service address. Looked up in every pass (a harvest
     * pass sends a partial up with it), and compared here with a result's port and rank. */
    action set_uplink(sdn_port_t port, bit<8> rank, ipv4_addr_t parent_ip,
                      mac_addr_t parent_mac) {
        meta.has_uplink = 1;
        meta.uplink_port = (PortId_t)(bit<9>)port;
        meta.uplink_port_diff = (bit<9>)port ^ ig_intr_md.ingress_port;
        meta.uplink_rank = rank;
        meta.uplink_rank_diff = rank ^ hdr.agg.rank;
        meta.parent_ip = parent_ip;
        meta.parent_mac = parent_mac;
    }

    table uplink {
        key = { hdr.agg.job_id: exact; }
        actions = { set_uplink; @defaultonly NoAction; }
        const default_action = NoAction();
        size = MAX_JOBS;
    }

    action header_ok(bit<1> slot_high) {
        meta.hdr_drop = DROP_NONE;
        meta.slot_high = slot_high;
    }

    action header_bad(bit<8> reason) {
        meta.hdr_drop = reason;
    }

    /* The header's checks as one table, in v1model's order of precedence (the first
     * entry that matches wins): a chain of if-statements costs a logical table per
     * branch, and stage 0 has 16 for forwarding and the lookups. Every field a check
     * reads is a key; the slot's bits above NUM_SLOTS are flagged for the admission. A
     * result (RESULT set) passes the same checks; the admission takes it only from the
     * parent of a leaf. */
    table header_check {
        key = {
            hdr.agg.isValid(): exact;
            hdr.agg.version: ternary;
            hdr.agg.shadow: ternary;
            hdr.agg.ncells: range;
            hdr.udp.length: ternary;
            hdr.ipv4.total_len: ternary;
            hdr.agg.op: range;
            hdr.agg.slot: ternary;
        }
        actions = { header_ok; header_bad; }
        const entries = {
            (true, AGG_VERSION, 0 &&& 0xfe, 1 .. CELLS_PER_PKT,
             AGG_UDP_LENGTH, AGG_IPV4_LENGTH, AGG_OP_ADD .. AGG_OP_MAX, 0 &&& 0xf000):
                header_ok(0);
            (true, AGG_VERSION, 0 &&& 0xfe, 1 .. CELLS_PER_PKT,
             AGG_UDP_LENGTH, AGG_IPV4_LENGTH, AGG_OP_ADD .. AGG_OP_MAX, _):
                header_ok(1);
            (true, AGG_VERSION, 0 &&& 0xfe, 1 .. CELLS_PER_PKT,
             AGG_UDP_LENGTH, AGG_IPV4_LENGTH, _, _):
                header_bad(DROP_BAD_OP);
            (true, AGG_VERSION, 0 &&& 0xfe, _, _, _, _, _):
                header_bad(DROP_BAD_LENGTH);
        }
        const default_action = header_bad(DROP_BAD_HEADER);
        size = 4;
    }

    action count_event(bit<2> event) {
        meta.has_event = 1;
        meta.event = event;
    }

    /* Send the packet round through the pipe's recirculation port to read more cells. */
    action recirculate(bit<8> step, bit<8> send_to) {
        hdr.harvest.setValid();
        hdr.harvest.step = step;
        hdr.harvest.send_to = send_to;
        hdr.harvest.slot_sum = meta.slot_sum;
        hdr.harvest.mcast_grp = meta.mcast_grp;
        hdr.harvest.pad = 0;
        hdr.harvest.port = ig_intr_md.ingress_port;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRC_PORT_LOW;
        ig_tm_md.bypass_egress = 1;
    }

    /* A result leaves to the job's group; to_delivery marks it as the aggregation's own,
     * the only kind of packet the egress delivers (a routed one may carry RESULT too). */
    action to_group(bit<16> mcast_grp) {
        hdr.agg.flags = AGG_FLAG_RESULT;
        ig_tm_md.mcast_grp_a = mcast_grp;
        meta.to_delivery = 1;
    }

    /* A completed copy (or its re-send) leaves as one contribution to the parent, from
     * this leaf's service address (the contribution's destination) and uplink rank. */
    action to_parent(bit<8> flags) {
        hdr.agg.flags = flags;
        hdr.agg.rank = meta.uplink_rank;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = meta.parent_mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = meta.parent_ip;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.src_port = AGG_UDP_PORT;
        hdr.udp.dst_port = AGG_UDP_PORT;
        hdr.udp.checksum = 0;
        ig_tm_md.ucast_egress_port = meta.uplink_port;
    }

    /* The aggregation's refusals, in v1model's order of precedence (the first entry that
     * matches wins), as one table: as if-statements they cost a logical table a branch,
     * and the stages beside the cells have few to spare. Entries with a field at 0 come
     * before the one that takes it as anything, which so stands for "not 0". A packet
     * that passes them all goes on to its outcome (go_on); only a header's own drop
     * reaches the default. */
    action refuse(bit<8> reason) {
        meta.drop_reason = reason;
    }

    action refuse_header() {
        meta.drop_reason = meta.hdr_drop;
    }

    action go_on() {
    }

    table refusal {
        key = {
            meta.hdr_drop: ternary;
            meta.job_miss: ternary;
            hdr.agg.flags: ternary;
            meta.has_uplink: ternary;
            meta.uplink_port_diff: ternary;
            meta.uplink_rank_diff: ternary;
            meta.rank_miss: ternary;
            meta.port_diff: ternary;
            meta.admitted: ternary;
            meta.phase: ternary;
        }
        actions = { refuse; refuse_header; go_on; }
        const entries = {
            (DROP_NONE, 1, _, _, _, _, _, _, _, _): refuse(DROP_UNKNOWN_JOB);
            /* A result: only a leaf takes one, and only its parent's. */
            (DROP_NONE, 0, AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 0, _, _, _, _, _, _):
                refuse(DROP_BAD_HEADER);
            (DROP_NONE, 0, AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 1, 0, 0, _, _, 0, _):
                refuse(DROP_SLOT_OUT_OF_POOL);
            (DROP_NONE, 0, AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 1, 0, 0, _, _, 1, PARENT_RESULT):
                go_on();
            (DROP_NONE, 0, AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 1, 0, 0, _, _, 1, _):
                refuse(DROP_STALE);
            (DROP_NONE, 0, AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 1, 0, _, _, _, _, _):
                refuse(DROP_BAD_RANK);
            (DROP_NONE, 0, AGG_FLAG_RESULT &&& AGG_FLAG_RESULT, 1, _, _, _, _, _, _):
                refuse(DROP_WRONG_PORT);
            /* A contribution. */
            (DROP_NONE, 0, 0 &&& AGG_FLAG_RESULT, _, _, _, 1, _, _, _): refuse(DROP_BAD_RANK);
            (DROP_NONE, 0, 0 &&& AGG_FLAG_RESULT, _, _, _, 0, 0, 0, _):
                refuse(DROP_SLOT_OUT_OF_POOL);
            (DROP_NONE, 0, 0 &&& AGG_FLAG_RESULT, _, _, _, 0, 0, 1, VERDICT_STALE):
                refuse(DROP_STALE);
            (DROP_NONE, 0, 0 &&& AGG_FLAG_RESULT, _, _, _, 0, 0, 1, _): go_on();
            (DROP_NONE, 0, 0 &&& AGG_FLAG_RESULT, _, _, _, 0, _, _, _): refuse(DROP_WRONG_PORT);
        }
        const default_action = refuse_header();
        size = 12;
    }

    /* What the pass that has read a copy does with it (harvest_h.send_to), as one table
     * for the same reason: read the hi words in one more pass, or send the result to the
     * worker that asked, to the job's group or, at a leaf, the partial up to the parent
     * (dropped when the job's uplink entry went away between the passes: the job is
     * being removed, and the partial has nowhere to go). */
    action harvest_more() {
        hdr.harvest.step = HARVEST_HI_LAST;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
        ig_tm_md.bypass_egress = 1;
    }

    action send_to_sender() {
        hdr.agg.flags = AGG_FLAG_RESULT | AGG_FLAG_RETX;
        ig_tm_md.ucast_egress_port = hdr.harvest.port;
        meta.to_delivery = 1;
        count_event((bit<2>)EVENT_RESENT);
        hdr.harvest.setInvalid();
    }

    action send_to_group() {
        to_group(hdr.harvest.mcast_grp);
        count_event((bit<2>)EVENT_RESULT);
        hdr.harvest.setInvalid();
    }

    action partial_lost() {
        meta.drop_reason = DROP_UNKNOWN_JOB;
    }

    action send_to_parent(bit<8> flags) {
        to_parent(flags);
        count_event((bit<2>)EVENT_PARTIAL);
        hdr.harvest.setInvalid();
    }

    table harvest_send {
        key = {
            meta.phase: ternary;
            hdr.harvest.send_to: ternary;
            meta.has_uplink: ternary;
        }
        actions = { harvest_more; send_to_sender; send_to_group; partial_lost; send_to_parent; }
        const entries = {
            (HARVEST_LO_MORE, _, _): harvest_more();
            (_, SEND_TO_SENDER, _): send_to_sender();
            (_, SEND_TO_GROUP, _): send_to_group();
            (_, _, 0): partial_lost();
            (_, SEND_TO_PARENT, _): send_to_parent(0);
        }
        const default_action = send_to_parent(AGG_FLAG_RETX);
        size = 5;
    }

    apply {
        /* The header's own checks, then the lookups: stage 0, beside forwarding. A
         * recirculated pass does only the reads below (and the uplink's lookup, to send a
         * partial up). */
        if (!hdr.harvest.isValid()) {
            header_check.apply();
            if (hdr.agg.isValid()) {
                job_table.apply();
                worker_table.apply();
            }
        }
        if (hdr.agg.isValid()) {
            uplink.apply();
        }

        /* The admission: every check passed, the slot in the pool, the source address not
         * condemned by service_source; then round_table admits a contribution from its
         * worker's port and a result from the parent through the uplink (its keys: one
         * more condition here would cost a stage before the round). */
        if (meta.to_aggregation == 1 && meta.hdr_drop == DROP_NONE && meta.job_miss == 0
                && meta.source_port_diff == 0 && meta.slot_high == 0 && meta.base_high == 0
                && meta.slot_sum[15:12] == 0 && meta.room != 0 && meta.room[15:15] == 0) {
            round_state.apply(hdr, meta);
        }
        if (meta.admitted == 1) {
            seen_state.apply(hdr, meta);
        }
        count_state.apply(hdr, meta);
        cells.apply(hdr, meta);

        if (meta.to_aggregation == 1) {
            switch (refusal.apply().action_run) {
                go_on: {
                    if ((hdr.agg.flags & AGG_FLAG_RESULT) != 0) {
                        /* The parent's result: accepted (recirculated to store it),
                         * or a duplicate of one accepted, or stale. */
                        if (meta.count == meta.num_workers) {
                            recirculate(HARVEST_STORE, SEND_TO_GROUP);
                        } else if (meta.count == meta.final_count) {
                            meta.drop_reason = DROP_DUPLICATE;
                        } else {
                            meta.drop_reason = DROP_STALE;
                        }
                    } else if (meta.phase == VERDICT_FRESH
                            || (meta.phase == VERDICT_COMBINE && meta.seen_before == 0)) {
                        count_event((bit<2>)EVENT_CONTRIBUTION);
                        if (meta.count != meta.num_workers) {
                            meta.absorbed = 1;
                        } else if (meta.has_uplink == 1) {
                            /* At a leaf: the partial goes up (VERDICT_* FRESH or COMBINE). */
                            if (meta.phase == VERDICT_COMBINE && hdr.agg.op == AGG_OP_MAX) {
                                recirculate(HARVEST_HI_LAST, SEND_TO_PARENT);
                            } else {
                                recirculate(HARVEST_LO_LAST, SEND_TO_PARENT);
                            }
                        } else if (meta.phase == VERDICT_COMBINE && hdr.agg.op == AGG_OP_MAX) {
                            recirculate(HARVEST_HI_LAST, SEND_TO_GROUP);
                        } else {
                            recirculate(HARVEST_LO_LAST, SEND_TO_GROUP);
                        }
                    } else if (meta.count == meta.num_workers) {
                        /* Complete, not final: at a leaf the partial goes up again
                         * (VERDICT_RESEND_UP), elsewhere the result back (VERDICT_RESEND). */
                        if (meta.has_uplink == 1) {
                            recirculate(HARVEST_LO_MORE, SEND_TO_PARENT_RETX);
                        } else {
                            recirculate(HARVEST_LO_MORE, SEND_TO_SENDER);
                        }
                    } else if (meta.count == meta.final_count) {
                        recirculate(HARVEST_LO_MORE, SEND_TO_SENDER);
                    } else {
                        meta.drop_reason = DROP_DUPLICATE;
                    }
                }
            }
        } else if (hdr.harvest.isValid()) {
            harvest_send.apply();
        }
        if (meta.has_event == 1) {
            event_counter.count(meta.event);
        }
    }
}
