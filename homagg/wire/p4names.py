"""Names of the P4 program's objects as they appear in its P4Info (p4c derives them
from the control instances in p4src/homagg.p4); the controller and the reference switch
both address the program through these. Only names the Python side uses are here: the
direct counters of job_table and worker_table are read through their tables."""

# Forwarding (p4src/forwarding.p4)
ARP_RESPONDER = "SwitchIngress.forwarding.arp_responder"
ARP_REPLY = "SwitchIngress.forwarding.arp_reply"
IPV4_LPM = "SwitchIngress.forwarding.ipv4_lpm"
ROUTE = "SwitchIngress.forwarding.route"
AGGREGATE = "SwitchIngress.forwarding.aggregate"
NO_ROUTE = "SwitchIngress.forwarding.no_route"
# Service source addresses (docs/protocol.md, "Ordinary traffic").
SERVICE_SOURCE = "SwitchIngress.forwarding.service_source"
OWN_SERVICE = "SwitchIngress.forwarding.own_service"
PEER_SERVICE = "SwitchIngress.forwarding.peer_service"

# Aggregation (p4src/aggregation.p4)
JOB_TABLE = "SwitchIngress.aggregation.job_table"
SET_JOB = "SwitchIngress.aggregation.set_job"
UNKNOWN_JOB = "SwitchIngress.aggregation.unknown_job"
WORKER_TABLE = "SwitchIngress.aggregation.worker_table"
SET_WORKER = "SwitchIngress.aggregation.set_worker"
EVENT_COUNTER = "SwitchIngress.aggregation.event_counter"
# A leaf of a two-level job (docs/protocol.md, Two-level aggregation).
UPLINK = "SwitchIngress.aggregation.uplink"
SET_UPLINK = "SwitchIngress.aggregation.set_uplink"

# Result delivery (p4src/delivery.p4)
RESULT_REWRITE = "SwitchEgress.delivery.result_rewrite"
TO_WORKER = "SwitchEgress.delivery.to_worker"
NO_RECIPIENT = "SwitchEgress.delivery.no_recipient"

# Drop counters, indexed by homagg.wire.constants.DropReason
INGRESS_DROPS = "SwitchIngress.drop_counter"
EGRESS_DROPS = "SwitchEgress.drop_counter"

# The tables of every job and of every switch's forwarding.
TABLES = (ARP_RESPONDER, IPV4_LPM, JOB_TABLE, WORKER_TABLE, RESULT_REWRITE)
# The tables a switch gets entries in as part of a tree: two-level aggregation's uplink and
# the check of service source addresses (the TNA program has them too: docs/tofino.md).
TREE_TABLES = (UPLINK, SERVICE_SOURCE)
COUNTERS = (INGRESS_DROPS, EGRESS_DROPS, EVENT_COUNTER)
