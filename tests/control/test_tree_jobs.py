"""A job across a tree of switches in the job manager, with switches that are never reached
(the entries as data): world sizes above 32 only on a tree, each rank's assignment naming its
leaf, the entries each switch is to hold, a restart that restores the tree's pools, and an
end that queues the removals on every switch of the tree and frees every pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from ctl_helpers import UPLINK_PORT, config_dict, tree_config_dict

from homagg.api.errors import InvalidArgument, ResourceExhausted
from homagg.control.config import parse_config
from homagg.control.jobs import JobManager
from homagg.control.store import Store
from homagg.control.switches import ManagedSwitch
from homagg.control.tree import job_entries
from homagg.control.views import pool_ranges, port_buffer_views
from homagg.lab.addresses import host_entry

ADDRESSES = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")  # never reached


def manager(tmp_path: Path, doc: dict) -> JobManager:
    m = JobManager(parse_config(doc, tmp_path), Store(tmp_path / "controller.db"))
    with m.lock:
        for name in m.switches:
            m.switch_synced(name, [])  # as if each switch had been read back
    return m


@pytest.fixture
def m(tmp_path: Path) -> JobManager:
    return manager(tmp_path, tree_config_dict(ADDRESSES, tmp_path))


def join(
    m: JobManager, job, token: str, rank: int, leaf: int, index: int, udp: int = 41000
) -> None:
    host = host_entry(index, leaf)
    m.join(job.job_id, token, rank, host["mac"], host["ip"], udp + rank)


def test_a_world_of_40_needs_a_tree(tmp_path: Path, m: JobManager):
    flat = manager(tmp_path / "flat", config_dict([("s1", ADDRESSES[0], [])], tmp_path / "flat"))
    with pytest.raises(InvalidArgument, match="40 ranks need a tree of switches"):
        flat.create("big", 40, "dense", 8)
    with pytest.raises(InvalidArgument, match="switch leaf1 cannot hold them"):
        m.create("big", 40, "dense", 8, switch="leaf1")
    job, _ = m.create("big", 40, "dense", 8)
    assert job.switch is None  # placed as its ranks join


def test_ranks_on_two_leaves_run_on_the_tree(m: JobManager):
    job, token = m.create("tree", 4, "dense", 16)
    for rank, (leaf, index) in enumerate([(1, 0), (2, 0), (1, 1), (2, 1)]):
        join(m, job, token, rank, leaf, index)
    assert job.complete and (job.switch, list(job.leaves)) == ("spine", ["leaf1", "leaf2"])
    assert not job.installed  # the switches are never reached
    with m.lock:
        assert [e.job_id for e in m.desired_jobs("leaf2")] == [job.job_id]
        for name in ("leaf1", "spine", "leaf2"):
            m.switch_synced(name, [job.job_id])
    assert job.installed
    got = {r: m.wait_ready(job.job_id, token, r, 1) for r in range(4)}
    assert {r: (a.switch, a.service_ip) for r, a in got.items()} == {
        0: ("leaf1", "10.0.1.254"),
        1: ("leaf2", "10.0.2.254"),
        2: ("leaf1", "10.0.1.254"),
        3: ("leaf2", "10.0.2.254"),
    }
    assert got[1].switch_mac == m.configs["leaf2"].mac and got[1].pool_size == 16
    used = {(r.switch, r.job_id) for r in pool_ranges(m) if r.job_id}
    assert used == {("spine", job.job_id), ("leaf1", job.job_id), ("leaf2", job.job_id)}
    with m.lock:
        m.switch_lost("leaf1")
    assert not job.installed and job.state.value == "installing"


def test_a_restart_restores_the_tree_and_an_end_clears_every_switch(tmp_path: Path):
    doc = tree_config_dict(ADDRESSES, tmp_path)
    m = manager(tmp_path, doc)
    job, token = m.create("tree", 2, "dense", 16)
    join(m, job, token, 0, 2, 0)
    join(m, job, token, 1, 1, 0)
    want = job_entries(job, m.configs)
    m.store.close()
    again = manager(tmp_path, doc)
    back = again.jobs[job.job_id]
    assert (back.switch, back.leaves, back.pool_base) == (job.switch, job.leaves, job.pool_base)
    assert [w.switch for w in back.workers.values()] == ["leaf2", "leaf1"]
    assert job_entries(back, again.configs) == want
    assert all(s.pools.used_ranges() == [(0, 16)] for s in again.switches.values())
    again.leave(job.job_id, token, 0)
    assert again.leave(job.job_id, token, 1)  # the last rank: the job ends
    for name, sw in again.switches.items():
        assert sw.pools.used_ranges() == []
        assert sw.pending_removals == {job.job_id: want[name]}
    assert again.list_jobs(include_ended=True)[0].leaves == job.leaves


def test_the_parent_is_written_first_and_cleared_last(tmp_path: Path, monkeypatch):
    """The switch writes across a tree: a leaf is installed only once its parent holds the
    job (its supervisor waits for it), removals go leaves first, parent last."""
    up: set[str] = set()
    log: list[tuple[str, str]] = []
    monkeypatch.setattr(ManagedSwitch, "connected", property(lambda sw: sw.name in up))
    monkeypatch.setattr(ManagedSwitch, "install", lambda sw, e: log.append((sw.name, "install")))
    monkeypatch.setattr(
        ManagedSwitch, "remove", lambda sw, e, strict=False: log.append((sw.name, "remove")) or True
    )
    m = manager(tmp_path, tree_config_dict(ADDRESSES, tmp_path))
    job, token = m.create("tree", 2, "dense", 8)
    up.update({"leaf1", "leaf2"})  # the parent is away when the world completes
    join(m, job, token, 0, 1, 0)
    join(m, job, token, 1, 2, 0)
    for name in ("leaf1", "leaf2"):
        m.settle(name)
    assert log == [] and not job.installed  # no leaf before its parent
    up.add("spine")
    m.settle("leaf2")
    m.settle("spine")
    m.settle("leaf2")
    m.settle("leaf1")
    assert log == [("spine", "install"), ("leaf2", "install"), ("leaf1", "install")]
    assert job.installed
    log.clear()
    m.leave(job.job_id, token, 0)
    m.leave(job.job_id, token, 1)
    assert log == [("leaf2", "remove"), ("leaf1", "remove"), ("spine", "remove")]


def test_a_trees_uplinks_count_in_their_ports_buffers(tmp_path: Path):
    """A leaf's partial sums go up its uplink and the parent's results come down its port
    toward the leaf: a pool's worth in flight on each, shared with other jobs like a rank's
    port; a job that would overrun an uplink is refused when it would span it."""
    doc = tree_config_dict(ADDRESSES, tmp_path)
    for sw in doc["switch"]:
        sw["port_buffer"] = 24
    m = manager(tmp_path, doc)
    a, ta = m.create("a", 2, "dense", 16)
    join(m, a, ta, 0, 1, 0)
    join(m, a, ta, 1, 2, 0)
    ports = {(b.switch, b.port): (b.used, b.headroom) for b in port_buffer_views(m)}
    assert ports[("leaf1", UPLINK_PORT)] == ports[("spine", 2)] == (16, 8)
    b, tb = m.create("b", 2, "dense", 16)
    join(m, b, tb, 0, 1, 1, udp=42000)
    with pytest.raises(ResourceExhausted, match=r"port 100 \(the uplink between leaf1 and spine"):
        join(m, b, tb, 1, 2, 1, udp=42000)
    assert (b.switch, b.leaves, list(b.workers)) == ("leaf1", {}, [0])  # nothing changed
    assert m.switches["spine"].pools.used_ranges() == [(0, 16)]
