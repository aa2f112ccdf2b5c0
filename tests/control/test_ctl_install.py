"""The install path (homagg/control/install.py, and ManagedSwitch over it) against a scripted
switch:
entries go in INSTALL_ORDER and come out in reverse, a refused update rolls back everything the
install wrote (never a half-installed job), an entry left over from before is overwritten, a
lost link is Unavailable, and a reconciliation writes exactly the difference in the same order."""

from __future__ import annotations

import threading
from dataclasses import replace

import grpc
import pytest

from homagg.api.errors import Unavailable
from homagg.control.aggregation import JobEntries, Uplink, Worker
from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.config import SwitchConfig
from homagg.control.entries import MULTICAST_GROUPS
from homagg.control.forwarding import Host, forwarding_entries
from homagg.control.install import (
    INSTALL_ORDER,
    InstallError,
    Reconciled,
    install_job,
    job_specs,
    reconcile,
    remove_job,
)
from homagg.control.switch_connection import P4RuntimeWriteError, SwitchError, UpdateError
from homagg.control.switches import ManagedSwitch, SwitchRejected
from homagg.control.write_batch import WriteBatch
from homagg.lab.addresses import host_ip, host_mac, host_switch_port
from homagg.p4rt.api import p4runtime_pb2
from homagg.p4rt.entities import MulticastGroupEntry, TableEntry
from homagg.p4rt.p4info import P4InfoIndex
from homagg.wire import p4names
from homagg.wire.constants import WORKER_UDP_BASE

P4INFO = P4InfoIndex.from_text_file(P4INFO_PATH)
Update = p4runtime_pb2.Update
JOB = JobEntries(
    job_id=9,
    pool_base=0,
    pool_size=8,
    mcast_grp=9,
    workers=tuple(
        Worker(
            rank=r,
            switch_port=host_switch_port(r),
            mac=host_mac(r),
            ip=host_ip(r),
            udp_port=WORKER_UDP_BASE,
        )
        for r in range(3)
    ),
)


def key(update: p4runtime_pb2.Update) -> tuple:
    """What an update addresses: ("group", id) or (table name, encoded match)."""
    entity = update.entity
    if entity.HasField("packet_replication_engine_entry"):
        return (
            "group",
            entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id,
        )
    te = entity.table_entry
    return P4INFO.table(te.table_id).name, tuple(m.SerializeToString() for m in te.match)


def kind(update: p4runtime_pb2.Update) -> str:
    """Where an update writes, named as in INSTALL_ORDER."""
    k = key(update)[0]
    return MULTICAST_GROUPS if k == "group" else k


class ScriptedSwitch:
    """Applies writes to a set of keys, failing the updates `refuse` picks with its code."""

    def __init__(self, refuse=None, link_down_on_write: int | None = None) -> None:
        self.p4info = P4INFO
        self.held: set[tuple] = set()
        self.refuse = refuse or (lambda update: None)
        self.writes = 0
        self.state: dict[tuple, p4runtime_pb2.Update] = {}  # key -> the update that wrote it
        self.log: list[tuple[int, list[str]]] = []  # per write: (update type, kinds written)
        self.link_down_on_write = link_down_on_write
        self.is_connected = True
        self.is_primary, self.primary_losses = True, 0

    def batch(self) -> WriteBatch:
        return WriteBatch(P4INFO)

    def write_batch(self, batch) -> None:
        self.writes += 1
        self.log.append((batch.updates[0].type if len(batch) else 0, [kind(u) for u in batch]))
        if self.writes == self.link_down_on_write:
            self.is_connected = False
        if not self.is_connected:
            raise SwitchError(
                "P4Runtime call failed with UNAVAILABLE: socket closed", grpc.StatusCode.UNAVAILABLE
            )
        errors = []
        for i, update in enumerate(batch):
            k = key(update)
            code = self.refuse(update)
            if code is None and update.type == Update.INSERT and k in self.held:
                code = "ALREADY_EXISTS"
            if (
                code is None
                and update.type in (Update.MODIFY, Update.DELETE)
                and k not in self.held
            ):
                code = "NOT_FOUND"
            if code is not None:
                errors.append(UpdateError(i, code, "scripted"))
            elif update.type == Update.DELETE:
                self.held.discard(k)
                self.state.pop(k, None)
            else:
                self.held.add(k)
                self.state[k] = update
        if errors:
            raise P4RuntimeWriteError(errors, len(batch), grpc.StatusCode.UNKNOWN)

    def read_entries(self, table):
        return [
            TableEntry.from_proto(u.entity.table_entry, P4INFO)
            for k, u in self.state.items()
            if k[0] == table
        ]

    def read_multicast_groups(self):
        groups = [
            MulticastGroupEntry.from_proto(
                u.entity.packet_replication_engine_entry.multicast_group_entry
            )
            for k, u in self.state.items()
            if k[0] == "group"
        ]
        return {g.group_id: list(g.replicas) for g in groups}


class Listener:
    def desired_jobs(self, switch):
        return []

    def switch_synced(self, switch, job_ids):
        pass

    def settle(self, switch):
        pass

    def switch_lost(self, switch):
        pass

    def job_ids_held(self, switch, job_ids):
        pass


def managed(conn: ScriptedSwitch) -> ManagedSwitch:
    sw = ManagedSwitch(
        SwitchConfig("s1", "127.0.0.1:1", "02:00:00:00:00:fe", "10.0.0.254"),
        threading.RLock(),
        Listener(),
    )
    sw.conn = conn  # type: ignore[assignment]
    sw.synced = True  # as after the supervisor's reconciliation
    return sw


def stages(log: list[tuple[int, list[str]]]) -> list[tuple[int, str]]:
    """Each write as (update type, the one kind it wrote)."""
    assert all(len(set(kinds)) == 1 for _, kinds in log), log
    return [(kind_, kinds[0]) for kind_, kinds in log]


def test_install_order_covers_every_table_and_ends_with_the_job_entry():
    assert set(INSTALL_ORDER) == {*p4names.TABLES, *p4names.TREE_TABLES, MULTICAST_GROUPS}
    assert INSTALL_ORDER[-1] == p4names.JOB_TABLE
    assert INSTALL_ORDER.index(MULTICAST_GROUPS) < INSTALL_ORDER.index(p4names.RESULT_REWRITE)


def test_install_writes_group_results_workers_then_job_and_removes_in_reverse():
    conn = ScriptedSwitch()
    sw = managed(conn)
    sw.install(JOB)
    job_order = [MULTICAST_GROUPS, p4names.RESULT_REWRITE, p4names.WORKER_TABLE, p4names.JOB_TABLE]
    assert stages(conn.log) == [(Update.INSERT, k) for k in job_order]
    tables = sorted(k[0] for k in conn.held)
    assert tables == sorted(
        ["group", p4names.JOB_TABLE] + [p4names.WORKER_TABLE, p4names.RESULT_REWRITE] * 3
    )
    conn.log.clear()
    sw.remove(JOB)
    assert stages(conn.log) == [(Update.DELETE, k) for k in reversed(job_order)]
    assert conn.held == set() and not sw.needs_sync


def test_a_leaf_gets_its_uplink_first_and_loses_it_last():
    """At a leaf of a tree the uplink entry precedes the job's other entries (a job entry
    without it would multicast a partial sum as a result) and is removed after them."""
    leaf = replace(JOB, uplink=Uplink(100, 1, "10.0.100.254", "02:00:00:00:64:fe"))
    conn = ScriptedSwitch()
    sw = managed(conn)
    sw.install(leaf)
    job_order = [
        p4names.UPLINK,
        MULTICAST_GROUPS,
        p4names.RESULT_REWRITE,
        p4names.WORKER_TABLE,
        p4names.JOB_TABLE,
    ]
    assert stages(conn.log) == [(Update.INSERT, k) for k in job_order]
    conn.log.clear()
    sw.remove(leaf)
    assert stages(conn.log) == [(Update.DELETE, k) for k in reversed(job_order)]
    assert conn.held == set()


def test_direct_install_rolls_back_and_reports_leftovers():
    conn = ScriptedSwitch(link_down_on_write=3)
    with pytest.raises(InstallError) as info:
        install_job(conn, JOB)  # type: ignore[arg-type]
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.leftovers
    problems = remove_job(conn, JOB)  # type: ignore[arg-type]
    assert [e.code for e in problems] == [grpc.StatusCode.UNAVAILABLE]


@pytest.mark.parametrize("refused_table", [p4names.JOB_TABLE, p4names.WORKER_TABLE])
def test_refused_update_rolls_everything_back(refused_table):
    def refuse(update):
        te = update.entity.table_entry
        if te.table_id == P4INFO.table_id(refused_table) and update.type == Update.INSERT:
            return "RESOURCE_EXHAUSTED"
        return None

    conn = ScriptedSwitch(refuse)
    sw = managed(conn)
    with pytest.raises(SwitchRejected, match="RESOURCE_EXHAUSTED"):
        sw.install(JOB)
    assert conn.held == set() and not sw.needs_sync


def test_leftover_entries_are_overwritten():
    conn = ScriptedSwitch()
    sw = managed(conn)
    sw.install(JOB)
    held = set(conn.held)
    sw.install(JOB)  # e.g. a retry after the controller lost track: ALREADY_EXISTS becomes MODIFY
    assert conn.held == held


def test_lost_link_is_unavailable_and_leftovers_marked():
    conn = ScriptedSwitch(link_down_on_write=2)
    sw = managed(conn)
    with pytest.raises(Unavailable, match="unreachable while installing job 9"):
        sw.install(JOB)
    assert sw.needs_sync  # the group could not be removed: the reconciliation will


def test_remove_tolerates_missing_entries():
    conn = ScriptedSwitch()
    sw = managed(conn)
    sw.install(JOB)
    conn.held = {k for k in conn.held if k[0] != p4names.WORKER_TABLE}
    sw.remove(JOB)
    assert conn.held == set() and not sw.needs_sync


def test_reconcile_writes_the_difference_in_install_order():
    conn = ScriptedSwitch()
    hosts = [Host("10.0.0.1", "02:00:00:00:01:01", 1), Host("10.0.0.2", "02:00:00:00:01:02", 2)]
    forwarding = forwarding_entries(hosts, "10.0.0.254", "02:00:00:00:00:fe")
    done = reconcile(conn, forwarding + job_specs(JOB), read_back=False)  # type: ignore[arg-type]
    assert (done.installed, done.modified, done.removed) == (len(forwarding) + 7, 0, 0)
    assert [k for _, k in stages(conn.log)] == [k for k in INSTALL_ORDER if k != p4names.UPLINK]
    conn.log.clear()
    again = reconcile(conn, forwarding + job_specs(JOB))  # type: ignore[arg-type]
    assert again == Reconciled(0, 0, 0)
    assert conn.log == []  # nothing to write: nothing written
    moved = JobEntries(job_id=9, pool_base=64, pool_size=8, mcast_grp=9, workers=JOB.workers[:2])
    done = reconcile(conn, forwarding[:2] + job_specs(moved))  # type: ignore[arg-type]
    # Gone: host 2's two entries, the service address's two and its source check, rank 2's
    # two; changed: the job entry.
    assert (done.installed, done.modified, done.removed) == (0, 1, 7)
    assert stages(conn.log) == [
        (Update.DELETE, p4names.WORKER_TABLE),
        (Update.DELETE, p4names.RESULT_REWRITE),
        (Update.DELETE, p4names.SERVICE_SOURCE),
        (Update.DELETE, p4names.IPV4_LPM),
        (Update.DELETE, p4names.ARP_RESPONDER),
        (Update.MODIFY, MULTICAST_GROUPS),
        (Update.MODIFY, p4names.JOB_TABLE),
    ]


def test_reconcile_reports_the_ids_of_jobs_it_did_not_expect():
    """Stale entries name their job (group id, job_id match): a fresh database raises its
    next job id past them. A job entry without its group counts too."""
    conn = ScriptedSwitch()
    reconcile(conn, job_specs(JOB), read_back=False)  # type: ignore[arg-type]
    conn.state = {k: u for k, u in conn.state.items() if k[0] != "group"}
    conn.held = set(conn.state)
    assert conn.read_multicast_groups() == {}
    done = reconcile(conn, [])  # type: ignore[arg-type]
    assert done.stale_job_ids == (JOB.job_id,) and done.removed == 7
    assert reconcile(conn, []).stale_job_ids == ()  # type: ignore[arg-type]


def test_a_switch_with_its_own_program_pushes_it(tmp_path):
    p4info, device = tmp_path / "tna.p4info.txtpb", tmp_path / "device_config.pb"
    p4info.write_text(P4INFO_PATH.read_text())  # a copy stands for the TNA P4Info
    device.write_bytes(b"packed BfPipelineConfig")
    cfg = SwitchConfig(
        "t1", "127.0.0.1:1", "02:00:00:00:00:fe", "10.0.0.254", p4info=p4info, device_config=device
    )
    sw = ManagedSwitch(cfg, threading.RLock(), Listener())
    assert sw.artifacts == (p4info, device)
    plain = ManagedSwitch(
        SwitchConfig("s1", "127.0.0.1:2", "02:00:00:00:00:fd", "10.0.0.253"),
        threading.RLock(),
        Listener(),
    )
    assert plain.artifacts == (P4INFO_PATH, BMV2_JSON_PATH)


def test_a_large_stage_of_existing_entries_is_rewritten_on_the_reference_switch(refswitch):
    """The install acts on each failed update's code (ALREADY_EXISTS: retried as a modify).
    A stage of 300 entries that all exist is 300 failures, past what one Write's status can
    list on the reference switch (a summary without codes): they still come back with their
    codes (Writes of at most MAX_UPDATES_PER_WRITE), so every entry is rewritten and
    recorded as written, none mistaken for a refusal."""
    from homagg.control.install import _upsert
    from homagg.control.switch_connection import SwitchConnection

    hosts = [Host(f"10.1.{i // 250}.{i % 250 + 1}", "02:00:00:00:01:01", 1) for i in range(300)]
    conn = SwitchConnection(refswitch.address, election_id=10, timeout=5.0)
    conn.connect()
    try:
        conn.set_pipeline(P4INFO_PATH, BMV2_JSON_PATH)
        first = forwarding_entries(hosts, "10.9.0.254", "02:00:00:00:00:fe")
        arp = [s for s in first if s.kind == p4names.ARP_RESPONDER]
        assert len(arp) == 301
        _upsert(conn, arp, written := [])
        again = forwarding_entries(hosts, "10.9.0.254", "02:00:00:00:00:aa")  # a new switch MAC
        arp = [s for s in again if s.kind == p4names.ARP_RESPONDER]
        _upsert(conn, arp, written := [])
        assert len(written) == 301
        held = conn.read_entries(p4names.ARP_RESPONDER)
        assert len(held) == 301 and {e.params["mac"] for e in held} == {0x0200000000AA}
    finally:
        conn.close()
