/* Forwarding: proxy ARP for every address the controller knows (hosts and the
 * aggregation service all resolve to the switch's MAC), the check of service source
 * addresses, IPv4 LPM routing with static neighbor rewriting, and the hand-off of
 * aggregation traffic. */
#include "include/headers.p4"

control Forwarding(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t std) {
    action no_route() {
        meta.drop_reason = DROP_NO_ROUTE;
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
        std.egress_spec = std.ingress_port;
    }

    table arp_responder {
        key = { hdr.arp.tpa: exact; }
        actions = { arp_reply; no_route; }
        const default_action = no_route();
        size = ARP_TABLE_SIZE;
    }

    action route(port_t port, mac_addr_t src_mac, mac_addr_t dst_mac) {
        std.egress_spec = port;
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
     * forged: results and partials are only ever sent by the switches themselves. */
    port_t service_port = 0;

    action own_service() {
        meta.drop_reason = DROP_WRONG_PORT;
    }

    action peer_service(port_t port) {
        service_port = port;
    }

    table service_source {
        key = { hdr.ipv4.src_addr: exact; }
        actions = { own_service; peer_service; NoAction; }
        const default_action = NoAction();
        size = SERVICE_SOURCE_TABLE_SIZE;
    }

    apply {
        if (hdr.arp.isValid()) {
            if (hdr.arp.oper == ARP_OPER_REQUEST && hdr.arp.htype == ARP_HTYPE_ETHERNET
                    && hdr.arp.ptype == ETHERTYPE_IPV4 && hdr.arp.hlen == 6
                    && hdr.arp.plen == 4) {
                arp_responder.apply();
            } else {
                meta.drop_reason = DROP_UNSUPPORTED;
            }
        } else if (hdr.ipv4.isValid()) {
            /* Options would need a checksum over bytes the parser does not keep. */
            if (hdr.ipv4.ihl != 5) {
                meta.drop_reason = DROP_UNSUPPORTED;
            } else if (hdr.ipv4.ttl <= 1) {
                meta.drop_reason = DROP_TTL_EXPIRED;
            } else {
                switch (service_source.apply().action_run) {
                    peer_service: {
                        if (std.ingress_port != service_port) {
                            meta.drop_reason = DROP_WRONG_PORT;
                        }
                    }
                }
                if (meta.drop_reason == DROP_NONE) {
                    ipv4_lpm.apply();
                }
            }
        } else {
            meta.drop_reason = DROP_UNSUPPORTED;
        }
    }
}
