/* Result delivery (egress), as p4src/delivery.p4: every copy of a result leaves as a plain
 * unicast UDP datagram from the service address to one worker. Multicast replicas carry
 * instance = rank + 1 in egress_rid; a resent result (egress_rid 0) goes back to the rank
 * that asked for it. */
#include "headers.p4"

control ResultDelivery(inout egress_headers_t hdr, inout egress_metadata_t meta,
                       in egress_intrinsic_metadata_t eg_intr_md) {
    action to_worker(mac_addr_t mac, ipv4_addr_t ip, bit<16> udp_port) {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = ip;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.src_port = AGG_UDP_PORT;
        hdr.udp.dst_port = udp_port;
        hdr.udp.checksum = 0;
    }

    action no_recipient() {
        meta.drop_reason = DROP_NO_RECIPIENT;
    }

    table result_rewrite {
        key = { hdr.agg.job_id: exact; hdr.agg.rank: exact; }
        actions = { to_worker; @defaultonly no_recipient; }
        const default_action = no_recipient();
        size = MAX_WORKERS;
    }

    apply {
        if (eg_intr_md.egress_rid != 0) {
            hdr.agg.rank = (bit<8>)(eg_intr_md.egress_rid - 1);
        }
        result_rewrite.apply();
    }
}
