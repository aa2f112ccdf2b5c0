"""The byte layout of the eBPF program's maps (p4src/ebpf/maps.h): how a P4Runtime table
entry, a multicast group or a counter cell becomes a map key and value. Host byte order
("=") for the program's own integers, network order where the program copies the bytes
into a frame. The data plane checks these sizes against the loaded object's."""

from __future__ import annotations

import struct

from homagg.refswitch.table import Entry
from homagg.wire import p4names

MAX_REPLICAS = 64  # maps.h: replicas of one multicast group
IPV4_NO_ROUTE, IPV4_ROUTE, IPV4_AGGREGATE = 0, 1, 2  # maps.h: enum ipv4_action
OWN_SERVICE, PEER_SERVICE = 1, 2  # maps.h: enum service_action
U32 = struct.Struct("=I")
JOB_RANK = struct.Struct("=II")
COUNT = struct.Struct("=QQ")  # struct count: packets, bytes
_ARP = struct.Struct("=6s2x")
_LPM_KEY = struct.Struct("=I4s")
_ROUTE = struct.Struct("=II6s6s")
_SERVICE = struct.Struct("=II")  # action, port
_JOB = struct.Struct("=IIII")
_WORKER = struct.Struct("=II")
_UPLINK = struct.Struct("=II")  # port, rank
_UPLINK_TAIL = struct.Struct("!I6s2x")  # parent_ip, parent_mac: copied into the frame
_RECIPIENT = struct.Struct("=6s")
_RECIPIENT_TAIL = struct.Struct("!HI")  # udp_port, ip: copied into the frame as they are
_REPLICA = struct.Struct("=II")

# P4 table -> (its map, its direct counter's map or None)
TABLE_MAPS: dict[str, tuple[str, str | None]] = {
    p4names.ARP_RESPONDER: ("arp_responder", None),
    p4names.IPV4_LPM: ("ipv4_lpm", None),
    p4names.SERVICE_SOURCE: ("service_source", None),
    p4names.JOB_TABLE: ("job_table", "job_packets"),
    p4names.WORKER_TABLE: ("worker_table", "worker_packets"),
    p4names.UPLINK: ("uplink", None),
    p4names.RESULT_REWRITE: ("result_rewrite", None),
}
# P4 counter -> its per-CPU array
COUNTER_MAPS = {
    p4names.INGRESS_DROPS: "ingress_drops",
    p4names.EGRESS_DROPS: "egress_drops",
    p4names.EVENT_COUNTER: "event_counter",
}
# map -> (key size, value size) as maps.h declares them
SIZES: dict[str, tuple[int, int]] = {
    "arp_responder": (U32.size, _ARP.size),
    "ipv4_lpm": (_LPM_KEY.size, _ROUTE.size),
    "service_source": (U32.size, _SERVICE.size),
    "job_table": (U32.size, _JOB.size),
    "worker_table": (JOB_RANK.size, _WORKER.size),
    "uplink": (U32.size, _UPLINK.size + _UPLINK_TAIL.size),
    "result_rewrite": (JOB_RANK.size, _RECIPIENT.size + _RECIPIENT_TAIL.size),
    "multicast_groups": (U32.size, U32.size + MAX_REPLICAS * _REPLICA.size),
    "job_packets": (U32.size, COUNT.size),
    "worker_packets": (JOB_RANK.size, COUNT.size),
    "ingress_drops": (U32.size, COUNT.size),
    "egress_drops": (U32.size, COUNT.size),
    "event_counter": (U32.size, COUNT.size),
    "port_ifindex": (U32.size, U32.size),
    "ifindex_port": (U32.size, U32.size),
    "pipeline": (U32.size, U32.size),
}


def _mac(value: int) -> bytes:
    return value.to_bytes(6, "big")


def entry_key(table: str, entry: Entry) -> bytes:
    """The map key of a table entry (exact fields, or the LPM prefix and address)."""
    values = [value for value, _ in entry.match]
    if table == p4names.IPV4_LPM:
        address, prefix_len = entry.match[0]
        return _LPM_KEY.pack(prefix_len, address.to_bytes(4, "big"))
    if table in (p4names.WORKER_TABLE, p4names.RESULT_REWRITE):
        return JOB_RANK.pack(*values)
    return U32.pack(values[0])


def entry_value(table: str, entry: Entry) -> bytes:
    """The map value of a table entry: its action's parameters as the program reads them."""
    p = entry.params
    if table == p4names.ARP_RESPONDER:
        return _ARP.pack(_mac(p["mac"]))
    if table == p4names.IPV4_LPM:
        if entry.action_name == p4names.ROUTE:
            return _ROUTE.pack(IPV4_ROUTE, p["port"], _mac(p["src_mac"]), _mac(p["dst_mac"]))
        action = IPV4_AGGREGATE if entry.action_name == p4names.AGGREGATE else IPV4_NO_ROUTE
        return _ROUTE.pack(action, 0, bytes(6), bytes(6))
    if table == p4names.SERVICE_SOURCE:
        if entry.action_name == p4names.OWN_SERVICE:
            return _SERVICE.pack(OWN_SERVICE, 0)
        return _SERVICE.pack(PEER_SERVICE, p["port"])
    if table == p4names.JOB_TABLE:
        return _JOB.pack(p["pool_base"], p["pool_size"], p["num_workers"], p["mcast_grp"])
    if table == p4names.WORKER_TABLE:
        return _WORKER.pack(p["port"], p["worker_bit"])
    if table == p4names.RESULT_REWRITE:
        return _RECIPIENT.pack(_mac(p["mac"])) + _RECIPIENT_TAIL.pack(p["udp_port"], p["ip"])
    if table == p4names.UPLINK:
        head = _UPLINK.pack(p["port"], p["rank"])
        return head + _UPLINK_TAIL.pack(p["parent_ip"], _mac(p["parent_mac"]))
    raise KeyError(f"no map for table {table}")


def group_value(replicas: list[tuple[int, int]]) -> bytes:
    """A multicast group's map value: its (port, rid) replicas, the first MAX_REPLICAS."""
    kept = replicas[:MAX_REPLICAS]
    body = b"".join(_REPLICA.pack(port, rid) for port, rid in kept)
    return U32.pack(len(kept)) + body.ljust(MAX_REPLICAS * _REPLICA.size, b"\0")


def sum_counts(per_cpu: list[bytes]) -> tuple[int, int]:
    """(packets, bytes) of a per-CPU count, summed over the CPUs."""
    cells = [COUNT.unpack(v) for v in per_cpu]
    return sum(c[0] for c in cells), sum(c[1] for c in cells)
