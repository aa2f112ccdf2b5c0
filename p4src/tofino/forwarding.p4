/* Forwarding in TNA: the same tables, keys and actions as p4src/forwarding.p4 (proxy
 * ARP, the check of service source addresses, IPv4 LPM routing with static neighbor
 * rewriting, the hand-off of aggregation traffic). It writes only fields of its own
 * (fwd_drop, to_aggregation, source_port_diff), so its tables share stage 0
 * with the aggregation's job and worker lookups. */
#include "headers.p4"

control Forwarding(inout ingress_headers_t hdr, inout ingress_metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    action no_route() {
        meta.fwd_drop = DROP_NO_ROUTE;
    }

    action arp_reply(mac_addr_t mac) {
        ipv4_addr_t target = hdr.arp.tpa;
        hdr.arp.oper = ARP_OPER_REPLY;
        hdr.arp.tha = hdr.arp.sha;
        hdr.arp.tpa = hdr.arp.spa;
        hdr.arp.sha = mac;
        hdr.arp.spa = target;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
    }

    table arp_responder {
        key = { hdr.arp.tpa: exact; }
        actions = { arp_reply; no_route; }
        const default_action = no_route();
        size = ARP_TABLE_SIZE;
    }

    action route(sdn_port_t port, mac_addr_t src_mac, mac_addr_t dst_mac) {
        ig_tm_md.ucast_egress_port = (PortId_t)(bit<9>)port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    action aggregate() {
        meta.to_aggregation = 1;
    }

    table ipv4_lpm {
        key = { hdr.ipv4.dst_addr: lpm; }
        actions = { route; aggregate; no_route; }
        const default_action = no_route();
        size = IPV4_TABLE_SIZE;
    }

    /* A frame from a service address that does not arrive from the switch owning it is
     * forged: results and partials are only ever sent by the switches themselves. Looked
     * up beside ipv4_lpm (not before it, as on v1model: that would cost a stage): a frame
     * it condemns is dropped as WRONG_PORT whatever the route said, and the aggregation
     * admits nothing from it (SwitchIngress, Aggregation). */
    action own_service() {
        meta.source_port_diff = 0x1ff;  /* from any port */
    }

    action peer_service(sdn_port_t port) {
        meta.source_port_diff = (bit<9>)port ^ ig_intr_md.ingress_port;
    }

    table service_source {
        key = { hdr.ipv4.src_addr: exact; }
        actions = { own_service; peer_service; NoAction; }
        const default_action = NoAction();
        size = SERVICE_SOURCE_TABLE_SIZE;
    }

    apply {
        if (hdr.arp.isValid()) {
            /* Two conditions: a gateway compares at most 4 bytes and 12 bits of PHV. */
            if (hdr.arp.oper != ARP_OPER_REQUEST || hdr.arp.htype != ARP_HTYPE_ETHERNET) {
                meta.fwd_drop = DROP_UNSUPPORTED;
            } else if (hdr.arp.ptype != ETHERTYPE_IPV4 || hdr.arp.hlen != 6
                    || hdr.arp.plen != 4) {
                meta.fwd_drop = DROP_UNSUPPORTED;
            } else {
                arp_responder.apply();
            }
        } else if (hdr.ipv4.isValid()) {
            /* Options would need a checksum over bytes the parser does not keep. */
            if (hdr.ipv4.ihl != 5) {
                meta.fwd_drop = DROP_UNSUPPORTED;
            } else if (hdr.ipv4.ttl <= 1) {
                meta.fwd_drop = DROP_TTL_EXPIRED;
            } else {
                service_source.apply();
                ipv4_lpm.apply();
            }
        } else {
            meta.fwd_drop = DROP_UNSUPPORTED;
        }
    }
}
