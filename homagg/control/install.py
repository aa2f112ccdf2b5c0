"""The one way entries reach a switch. Everything is written kind by kind in INSTALL_ORDER
and removed in the reverse order; the switch supervisor (homagg/control/switches.py), the test
fabric (homagg/lab/) and the tests all write through here.

The order is the dependency order of the pipeline: each kind refers only to kinds before
it, and a job's job_table entry, the one that makes the switch accept the job's packets,
comes last. So a job is written up to its job entry and torn down from it, and no packet
ever finds a job half built (until the job entry exists its packets are UNKNOWN_JOB drops).
A leaf's uplink entry comes before the rest of its job: a leaf job entry without it would
multicast a partial sum as a result. (Across the switches of a tree the parent's entries go
first: homagg/control/switch_writes.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from homagg.control.aggregation import JobEntries, job_entry, uplink_entries, worker_entries
from homagg.control.delivery import job_group, result_entries
from homagg.control.entries import MULTICAST_GROUPS, EntrySpec, GroupSpec, Spec
from homagg.control.switch_connection import P4RuntimeWriteError, SwitchConnection, SwitchError
from homagg.control.write_batch import WriteBatch
from homagg.wire import p4names

JOB_ID_FIELD = "hdr.agg.job_id"  # the match field of the job's entries in every table
INSTALL_ORDER: tuple[str, ...] = (
    p4names.ARP_RESPONDER,  # Forwarding: hosts and the service address resolve to the switch
    p4names.IPV4_LPM,  # Forwarding: routes to hosts, the hand-off to aggregation
    p4names.SERVICE_SOURCE,  # Forwarding: which port a service address may arrive on
    p4names.UPLINK,  # aggregation: a leaf's way up to its parent, before anything of its job
    MULTICAST_GROUPS,  # delivery: a job's result copies, one per rank
    p4names.RESULT_REWRITE,  # delivery: where each copy of a result goes
    p4names.WORKER_TABLE,  # aggregation: the ranks a job accepts, and on which port
    p4names.JOB_TABLE,  # aggregation: the job itself, written last and removed first
)


class InstallError(SwitchError):
    """A job install failed and what it wrote was removed again; `leftovers` is True when
    some of it could not be (the next reconciliation removes it). `code` is the cause's."""

    def __init__(self, job_id: int, cause: SwitchError, leftovers: bool) -> None:
        super().__init__(str(cause), cause.code)
        self.job_id, self.cause, self.leftovers = job_id, cause, leftovers


@dataclass(frozen=True)
class Reconciled:
    """What a reconciliation wrote: table entries installed, modified and removed (multicast
    groups are written too but not counted), and the ids of the stale groups it removed (a
    group's id is its job's id: jobs the switch held that the controller does not know)."""

    installed: int
    modified: int
    removed: int
    stale_job_ids: tuple[int, ...] = ()


def job_specs(job: JobEntries) -> list[Spec]:
    """Everything a job needs on a switch: its uplink at a leaf, its group and the entries of
    each P4 control."""
    return [
        *uplink_entries(job),
        job_group(job),
        *result_entries(job),
        *worker_entries(job),
        job_entry(job),
    ]


def in_install_order(specs: Sequence[Spec]) -> list[list[Spec]]:
    """The specs grouped by kind, the groups in INSTALL_ORDER (empty ones left out)."""
    stages: dict[str, list[Spec]] = {kind: [] for kind in INSTALL_ORDER}
    for spec in specs:
        if spec.kind not in stages:
            raise ValueError(f"{spec.kind} has no place in the install order")
        stages[spec.kind].append(spec)
    return [stage for stage in stages.values() if stage]


def _write(conn: SwitchConnection, steps: Sequence[Callable[[WriteBatch], WriteBatch]]) -> None:
    batch = conn.batch()
    for step in steps:
        step(batch)
    conn.write_batch(batch)


def install_job(conn: SwitchConnection, job: JobEntries) -> None:
    """Write a job's entries stage by stage in INSTALL_ORDER; an entry already there (left
    over from before) is overwritten. On a failure, remove what this call wrote, then raise
    InstallError."""
    job.validate()
    written: list[Spec] = []
    try:
        for stage in in_install_order(job_specs(job)):
            _upsert(conn, stage, written)
    except SwitchError as exc:
        raise InstallError(job.job_id, exc, leftovers=not _undo(conn, written)) from None


def _upsert(conn: SwitchConnection, stage: list[Spec], written: list[Spec]) -> None:
    """Insert a stage in one batch, retry the ALREADY_EXISTS ones as modifies; record what
    was written."""
    try:
        _write(conn, [s.insert for s in stage])
        written.extend(stage)
        return
    except P4RuntimeWriteError as exc:
        failed = {e.index: e.code for e in exc.errors}
        written.extend(s for i, s in enumerate(stage) if i not in failed)
        if any(code != "ALREADY_EXISTS" for code in failed.values()):
            raise
    retry = [stage[i] for i in sorted(failed)]
    _write(conn, [s.modify for s in retry])
    written.extend(retry)


def _undo(conn: SwitchConnection, written: list[Spec]) -> bool:
    """Delete what an install wrote, in reverse order; True when all of it is gone."""
    clean = True
    for stage in reversed(in_install_order(written)):
        try:
            _write(conn, [s.delete for s in stage])
        except SwitchError:
            clean = False
    return clean


def remove_job(conn: SwitchConnection, job: JobEntries) -> list[SwitchError]:
    """Delete a job's entries in the reverse of INSTALL_ORDER; entries already missing are
    fine. Returns the failures (none: the switch holds nothing of the job); a link failure
    stops the removal."""
    problems: list[SwitchError] = []
    for stage in reversed(in_install_order(job_specs(job))):
        try:
            _write(conn, [s.delete for s in stage])
        except P4RuntimeWriteError as exc:
            if any(code != "NOT_FOUND" for code in exc.codes):
                problems.append(exc)
        except SwitchError as exc:
            problems.append(exc)
            break
    return problems


def held(conn: SwitchConnection) -> dict[tuple, Spec]:
    """What the switch holds: every entry of the program's tables and every multicast group
    (a table its program lacks holds nothing)."""
    known = conn.p4info.tables.by_name
    specs: list[Spec] = [
        EntrySpec.read(e)
        for table in (*p4names.TABLES, *p4names.TREE_TABLES)
        if table in known
        for e in conn.read_entries(table)
    ]
    specs += [GroupSpec.of(gid, replicas) for gid, replicas in conn.read_multicast_groups().items()]
    return {s.key: s for s in specs}


def _job_id_of(spec: Spec) -> int:
    """The job a spec belongs to (a group's id is its job's, delivery.mcast_grp_of_job; job
    entries match on it), or 0."""
    if isinstance(spec, GroupSpec):
        return spec.group_id
    value = dict(spec.match).get(JOB_ID_FIELD, 0)
    return value if isinstance(value, int) else 0


def reconcile(
    conn: SwitchConnection,
    desired: Sequence[Spec],
    read_back: bool = True,
    vet: Callable[[tuple[int, ...]], None] | None = None,
) -> Reconciled:
    """Make the switch hold exactly `desired`: remove what is stale, then write what is missing
    or different, in INSTALL_ORDER. read_back=False: the switch holds nothing yet (a fresh
    pipeline), so nothing is read. `vet` is shown the ids of the stale jobs before anything
    is written and may raise to leave the switch untouched."""
    have = held(conn) if read_back else {}
    want = {s.key for s in desired}
    stale = [s for k, s in have.items() if k not in want]
    missing = [s for s in desired if s.key not in have]
    changed = [s for s in desired if s.key in have and have[s.key] != s]
    stale_ids = tuple(sorted({job_id for s in stale if (job_id := _job_id_of(s))}))
    if vet is not None:
        vet(stale_ids)
    for stage in reversed(in_install_order(stale)):
        _write(conn, [s.delete for s in stage])
    for stage in in_install_order(missing + changed):
        _write(conn, [s.modify if s.key in have else s.insert for s in stage])

    def entries(specs: list[Spec]) -> int:
        return sum(isinstance(s, EntrySpec) for s in specs)

    return Reconciled(entries(missing), entries(changed), entries(stale), stale_ids)
