/* Parsers: the ingress parses what the v1model parser does (Ethernet, ARP or option-less
 * unfragmented IPv4/UDP, the aggregation header and cells), after a harvest header when
 * the packet comes back from the pipe's recirculation port; the egress parses the bridge
 * header the ingress put in front, then up to the aggregation header, and leaves the
 * cells as payload. A packet too short for a header
 * reaches the ingress with parser_err set and is dropped as truncated, as on v1model. */
#include "headers.p4"

parser SwitchIngressParser(packet_in pkt, out ingress_headers_t hdr,
                           out ingress_metadata_t meta,
                           out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        meta = {
            fwd_drop = DROP_NONE, source_port_diff = 0, hdr_drop = DROP_NONE,
            to_aggregation = 0, job_miss = 0, rank_miss = 0, slot_high = 0, admitted = 0,
            absorbed = 0, to_delivery = 0, has_event = 0, event = 0, drop_reason = DROP_NONE,
            slot_sum = 0, base_high = 0, room = 0, num_workers = 0, final_count = 0,
            accept_count = 0, mcast_grp = 0, port_diff = 0, worker_bit = 0, fresh = 0, stale = 0,
            seen_before = 0, phase = 0, count = 0, has_uplink = 0, uplink_port = 0,
            uplink_port_diff = 0x1ff, uplink_rank = 0, uplink_rank_diff = 0, parent_ip = 0,
            parent_mac = 0
        };
        transition select(ig_intr_md.ingress_port) {
            (bit<9>)RECIRC_PORT_LOW &&& 0x7f: parse_harvest;
            default: parse_ethernet;
        }
    }
    state parse_harvest {
        pkt.extract(hdr.harvest);
        meta.phase = hdr.harvest.step;
        meta.slot_sum = hdr.harvest.slot_sum;
        transition parse_ethernet;
    }
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP: parse_arp;
            default: accept;
        }
    }
    state parse_arp {
        pkt.extract(hdr.arp);
        transition accept;
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            AGG_UDP_PORT: parse_agg;
            default: accept;
        }
    }
    state parse_agg {
        pkt.extract(hdr.agg);
        pkt.extract(hdr.cells);
        transition accept;
    }
}

parser SwitchEgressParser(packet_in pkt, out egress_headers_t hdr, out egress_metadata_t meta,
                          out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        meta.drop_reason = DROP_NONE;
        pkt.extract(hdr.bridge);
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            AGG_UDP_PORT: parse_agg;
            default: accept;
        }
    }
    state parse_agg {
        pkt.extract(hdr.agg);
        transition accept;
    }
}
