#!/bin/sh
# Make this network namespace's kernel accept nothing that arrives on the given interfaces (the
# switch's data ports), whatever address it is sent to: a routing rule ahead of the local table
# drops every IP packet received there. BMv2 reads its ports with libpcap, before routing, so
# the data plane is unaffected; what becomes unreachable from the data networks is every
# socket of this namespace, BMv2's Thrift server first (--thrift-port: table writes without a
# credential, on every interface, no option to bind one address). Linux takes packets for any
# of its addresses on any interface, so removing the data ports' own addresses would not do.
# Usage: close_data_ports.sh IFACE...   (needs CAP_NET_ADMIN and iproute2)
set -eu
pref=10
for iface in "$@"; do
  ip rule add pref "$pref" iif "$iface" blackhole
  pref=$((pref + 1))
done
# the local table after those rules (it is rule 0, first, by default)
ip rule add pref 100 lookup local
ip rule del pref 0 lookup local
