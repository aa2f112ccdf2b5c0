"""ManagedSwitch.install against a scripted switch: a refused update rolls back everything the
install wrote (never a half-installed job), an entry left over from before is overwritten, and
a lost link is Unavailable."""

from __future__ import annotations

import threading

import grpc
import pytest

from aggwire import p4names
from controller.aggregation import JobEntries, Worker
from controller.artifacts import P4INFO_PATH
from controller.config import SwitchConfig
from controller.errors import Unavailable
from controller.p4runtime_entities import WriteBatch
from controller.switch_connection import P4RuntimeWriteError, SwitchError, UpdateError
from controller.switches import ManagedSwitch, SwitchRejected
from p4rtproto.api import p4runtime_pb2
from p4rtproto.p4info import P4InfoIndex

P4INFO = P4InfoIndex.from_text_file(P4INFO_PATH)
Update = p4runtime_pb2.Update
JOB = JobEntries(job_id=9, pool_base=0, pool_size=8, mcast_grp=9, workers=tuple(
    Worker(rank=r, port=r + 1, mac=f"02:00:00:00:01:0{r + 1}", ip=f"10.0.0.{r + 1}", udp_port=41000) for r in range(3)))


def key(update: p4runtime_pb2.Update) -> tuple:
    """What an update addresses: ("group", id) or (table name, encoded match)."""
    entity = update.entity
    if entity.HasField("packet_replication_engine_entry"):
        return "group", entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id
    te = entity.table_entry
    return P4INFO.table(te.table_id).name, tuple(m.SerializeToString() for m in te.match)


class ScriptedSwitch:
    """Applies writes to a set of keys, failing the updates `refuse` picks with its code."""

    def __init__(self, refuse=None, link_down_on_write: int | None = None) -> None:
        self.p4info = P4INFO
        self.held: set[tuple] = set()
        self.refuse = refuse or (lambda update: None)
        self.writes = 0
        self.link_down_on_write = link_down_on_write
        self.is_connected = True

    def batch(self) -> WriteBatch:
        return WriteBatch(P4INFO)

    def write_batch(self, batch) -> None:
        self.writes += 1
        if self.writes == self.link_down_on_write:
            self.is_connected = False
        if not self.is_connected:
            raise SwitchError("P4Runtime call failed with UNAVAILABLE: socket closed", grpc.StatusCode.UNAVAILABLE)
        errors = []
        for i, update in enumerate(batch):
            k = key(update)
            code = self.refuse(update)
            if code is None and update.type == Update.INSERT and k in self.held:
                code = "ALREADY_EXISTS"
            if code is None and update.type in (Update.MODIFY, Update.DELETE) and k not in self.held:
                code = "NOT_FOUND"
            if code is not None:
                errors.append(UpdateError(i, code, "scripted"))
            elif update.type == Update.DELETE:
                self.held.discard(k)
            else:
                self.held.add(k)
        if errors:
            raise P4RuntimeWriteError(errors, len(batch), grpc.StatusCode.UNKNOWN)


class Listener:
    def desired_jobs(self, switch):
        return []

    def switch_synced(self, switch):
        pass

    def switch_lost(self, switch):
        pass


def managed(conn: ScriptedSwitch) -> ManagedSwitch:
    sw = ManagedSwitch(SwitchConfig("s1", "127.0.0.1:1", "02:00:00:00:00:fe", "10.0.0.254"),
                       threading.RLock(), Listener())
    sw.conn = conn  # type: ignore[assignment]
    return sw


def test_install_writes_group_then_workers_then_job():
    conn = ScriptedSwitch()
    managed(conn).install(JOB)
    assert conn.writes == 3
    tables = sorted(k[0] for k in conn.held)
    assert tables == sorted(["group", p4names.JOB_TABLE] + [p4names.WORKER_TABLE, p4names.RESULT_REWRITE] * 3)


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
