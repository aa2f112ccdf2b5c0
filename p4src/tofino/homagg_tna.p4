/* homagg for Tofino (TNA): the v1model program's protocol, tables and drop reasons in one
 * ingress/egress pipeline, a result read back over one recirculation (two for a resend).
 * Egress: delivery of the results the aggregation emitted (a bridge header carries the
 * mark). docs/protocol.md is the specification and docs/tofino.md maps each part of
 * p4src/homagg.p4 onto this program. */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

#include "headers.p4"
#if __TARGET_TOFINO__ == 2
/* slot_count's one output word goes to the count (meta) and to the exponent (a 32-bit
 * header container): Tofino 2's assembler cannot read a 32-bit action-bus slot for a
 * 16-bit container, which is where bf-p4c puts the count unless told. */
@pa_container_size("ingress", "meta.count", 32)
#endif
#include "parser.p4"
#include "forwarding.p4"
#include "aggregation.p4"
#include "delivery.p4"
#include "deparser.p4"

control SwitchIngress(inout ingress_headers_t hdr, inout ingress_metadata_t meta,
                      in ingress_intrinsic_metadata_t ig_intr_md,
                      in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                      inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                      inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Counter<bit<64>, bit<8>>(NUM_DROP_REASONS, CounterType_t.PACKETS_AND_BYTES) drop_counter;
    Forwarding() forwarding;
    Aggregation() aggregation;

    apply {
        if (ig_prsr_md.parser_err != PARSER_ERROR_OK) {
            meta.drop_reason = DROP_TRUNCATED;
        } else {
            /* Forwarding and the aggregation's lookups run side by side; the aggregation
             * acts on what forwarding decided (to_aggregation) from stage 1 on. A
             * recirculated pass skips forwarding. */
            if (!hdr.harvest.isValid()) {
                forwarding.apply(hdr, meta, ig_intr_md, ig_tm_md);
            }
            aggregation.apply(hdr, meta, ig_intr_md, ig_tm_md);
            /* service_source's verdict comes before the route's (v1model looks it up
             * first), and both before the aggregation's. */
            if (meta.source_port_diff != 0) {
                meta.drop_reason = DROP_WRONG_PORT;
            } else if (meta.fwd_drop != DROP_NONE) {
                meta.drop_reason = meta.fwd_drop;
            }
        }
        if (meta.drop_reason != DROP_NONE) {
            drop_counter.count(meta.drop_reason);
            ig_dprsr_md.drop_ctl = 1;
        } else if (meta.absorbed == 1) {
            ig_dprsr_md.drop_ctl = 1;
        } else if (!hdr.harvest.isValid()) {
            /* Tells the egress which packets are the aggregation's results. */
            hdr.bridge.setValid();
            hdr.bridge.pad = 0;
            hdr.bridge.to_delivery = meta.to_delivery;
        }
    }
}

control SwitchEgress(inout egress_headers_t hdr, inout egress_metadata_t meta,
                     in egress_intrinsic_metadata_t eg_intr_md,
                     in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                     inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                     inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    Counter<bit<64>, bit<8>>(NUM_DROP_REASONS, CounterType_t.PACKETS_AND_BYTES) drop_counter;
    ResultDelivery() delivery;

    apply {
        /* Only what the aggregation emitted as a result: a routed frame with RESULT set
         * keeps its headers. */
        if (hdr.bridge.to_delivery == 1) {
            delivery.apply(hdr, meta, eg_intr_md);
        }
        hdr.bridge.setInvalid();
        if (meta.drop_reason != DROP_NONE) {
            drop_counter.count(meta.drop_reason);
            eg_dprsr_md.drop_ctl = 1;
        }
    }
}

Pipeline(SwitchIngressParser(), SwitchIngress(), SwitchIngressDeparser(),
         SwitchEgressParser(), SwitchEgress(), SwitchEgressDeparser()) pipe;

Switch(pipe) main;
