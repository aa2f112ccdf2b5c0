#!/bin/sh
# The compose switch: BMv2 with its data ports eth1 and eth2 made ready first: their offloads
# off (homagg/lab/rawsock.py run as a script: with them on, a burst of more than ~31 frames per
# port is lost, docs/bmv2.md) and closed to this container's kernel
# (docker/close_data_ports.sh: BMv2's Thrift port, 9090 on every interface, is then
# reachable only from the p4runtime network, which the controller alone joins); P4Runtime on
# its p4runtime address only.
set -eu
python3 /homagg/rawsock.py eth1 eth2
sh /homagg/close_data_ports.sh eth1 eth2
exec simple_switch_grpc --no-p4 --device-id 0 --log-console --log-level warn \
  -i 1@eth1 -i 2@eth2 --thrift-port 9090 -- --grpc-server-addr 192.168.59.2:9559
