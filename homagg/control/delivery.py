"""Entries of result delivery (p4src/delivery.p4): the job's multicast group, which copies a
result to every rank, and the result_rewrite entry that turns each copy into a unicast
datagram to its rank."""

from __future__ import annotations

from homagg.control.aggregation import JobEntries, worker_key
from homagg.control.entries import EntrySpec, GroupSpec
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.wire import p4names


def mcast_grp_of_job(job_id: int) -> int:
    """The multicast group id of job `job_id`: the job id itself. Both are unique per switch
    and never reused early, so groups need no allocator of their own, and a group found on
    a switch names its job (install.reconcile relies on it)."""
    return job_id


def job_group(job: JobEntries) -> GroupSpec:
    """The job's multicast group: a replica per rank on the rank's switch port."""
    # Replica instance rank + 1: egress tells replicas apart by egress_rid, and 0 means unicast.
    return GroupSpec.of(job.mcast_grp, [(w.switch_port, w.rank + 1) for w in job.workers])


def result_entries(job: JobEntries) -> list[EntrySpec]:
    """Per rank: the MAC, IPv4 address and UDP port its copy of a result is rewritten to."""
    return [
        EntrySpec.of(
            p4names.RESULT_REWRITE,
            worker_key(job, w),
            p4names.TO_WORKER,
            {"mac": mac_to_int(w.mac), "ip": ipv4_to_int(w.ip), "udp_port": w.udp_port},
        )
        for w in job.workers
    ]
