/* homagg: in-network gradient aggregation for BMv2 (v1model).
 * Ingress: forwarding, then aggregation for traffic routed to the service address.
 * Egress: delivery of the results the aggregation emitted. docs/protocol.md is the specification. */
#include <core.p4>
#include <v1model.p4>

#include "include/headers.p4"
#include "parser.p4"
#include "forwarding.p4"
#include "aggregation.p4"
#include "delivery.p4"
#include "deparser.p4"

control SwitchIngress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t std) {
    counter(NUM_DROP_REASONS, CounterType.packets_and_bytes) drop_counter;
    Forwarding() forwarding;
    Aggregation() aggregation;

    apply {
        meta.drop_reason = DROP_NONE;
        meta.to_aggregation = 0;
        meta.absorbed = 0;
        meta.to_delivery = 0;
        if (std.parser_error != error.NoError) {
            meta.drop_reason = DROP_TRUNCATED;
        } else {
            forwarding.apply(hdr, meta, std);
            if (meta.to_aggregation == 1) {
                aggregation.apply(hdr, meta, std);
            }
        }
        if (meta.drop_reason != DROP_NONE) {
            drop_counter.count((bit<32>)meta.drop_reason);
            mark_to_drop(std);
        } else if (meta.absorbed == 1) {
            mark_to_drop(std);
        }
    }
}

control SwitchEgress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t std) {
    counter(NUM_DROP_REASONS, CounterType.packets_and_bytes) drop_counter;
    ResultDelivery() delivery;

    apply {
        meta.drop_reason = DROP_NONE;
        /* Only what the aggregation emitted as a result: a routed frame with RESULT set
         * keeps its headers (user metadata reaches every multicast replica in v1model). */
        if (meta.to_delivery == 1) {
            delivery.apply(hdr, meta, std);
        }
        if (meta.drop_reason != DROP_NONE) {
            drop_counter.count((bit<32>)meta.drop_reason);
            mark_to_drop(std);
        }
    }
}

V1Switch(SwitchParser(), SwitchVerifyChecksum(), SwitchIngress(), SwitchEgress(),
         SwitchComputeChecksum(), SwitchDeparser()) main;
