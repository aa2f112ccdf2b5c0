"""Trees of switches in the controller, as data (no switch, no P4Info entry needed): the
configuration's checks, which world sizes a topology holds, the placement of a job as its
ranks join (flat on one leaf, a tree once a sibling leaf joins) and the entries each switch of
a tree gets, in the order they are written."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from ctl_helpers import UPLINK_PORT, tree_config_dict

from homagg.api.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from homagg.control.aggregation import JobEntries, Uplink, Worker
from homagg.control.config import ConfigError, ControllerConfig, parse_config
from homagg.control.entries import MULTICAST_GROUPS
from homagg.control.forwarding import PeerService, forwarding_entries
from homagg.control.install import in_install_order, job_specs
from homagg.control.job_record import Job, JobWorker
from homagg.control.placement import admit, place, unplace
from homagg.control.switches import ManagedSwitch
from homagg.control.tree import (
    check_world_fits,
    job_entries,
    peer_services,
    transit_hosts,
    tree_capacity,
    tree_rows,
)
from homagg.lab.addresses import host_entry
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.wire import p4names
from homagg.wire.constants import AGG_UDP_PORT

ADDRESSES = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")


def tree_config(tmp_path: Path, **changes) -> ControllerConfig:
    doc = tree_config_dict(ADDRESSES, tmp_path)
    for index, values in changes.items():
        doc["switch"][int(index[1:])].update(values)
    return parse_config(doc, tmp_path)


@pytest.fixture
def config(tmp_path: Path) -> ControllerConfig:
    return tree_config(tmp_path)


@pytest.fixture
def switches(config: ControllerConfig) -> dict[str, ManagedSwitch]:
    """Managed switches that never connect: their pools and table sizes only."""
    lock = threading.RLock()
    return {s.name: ManagedSwitch(s, lock, None) for s in config.switches}  # type: ignore[arg-type]


def test_a_leaf_names_its_parent_and_both_ports(config):
    leaf = config.switch("leaf2")
    assert (leaf.parent, leaf.parent_port, leaf.port_on_parent) == ("spine", UPLINK_PORT, 2)
    assert config.switch("spine").parent == "" and config.switch("spine").parent_port is None


TREE_MISTAKES = {
    "parent alone": ({"s1": {"parent_port": None}}, "needs parent, parent_port"),
    "unknown parent": ({"s1": {"parent": "core"}}, "no switch 'core' is configured"),
    "own parent": ({"s1": {"parent": "leaf1"}}, "makes a cycle of parents"),
    "a cycle": (
        {"s0": {"parent": "leaf1", "parent_port": 9, "port_on_parent": 9}},
        "cycle of parents",
    ),
    "three levels": (
        {"s2": {"parent": "leaf1"}},
        r"leaf1 is itself a leaf \(of spine\)",
    ),
    "port out of range": ({"s1": {"parent_port": 511}}, "parent_port: 511 outside 0..510"),
    "uplink on a host port": ({"s1": {"parent_port": 1}}, "is also a host's port of leaf1"),
    "two leaves one port": ({"s2": {"port_on_parent": 1}}, "is also leaf1's"),
    "one host on two leaves": (
        {"s2": {"hosts": [host_entry(0, 1)]}},
        "host 10.0.1.1 is listed on two switches of spine's tree",
    ),
}


@pytest.mark.parametrize("case", list(TREE_MISTAKES))
def test_tree_mistakes_say_what_to_fix(case, tmp_path):
    changes, fragment = TREE_MISTAKES[case]
    doc = tree_config_dict(ADDRESSES, tmp_path)
    for index, values in changes.items():
        sw = doc["switch"][int(index[1:])]
        sw.update(values)
        for key in [k for k, v in sw.items() if v is None]:
            del sw[key]
    with pytest.raises(ConfigError, match=fragment):
        parse_config(doc, tmp_path)


def test_a_tree_takes_the_tofino_program_on_every_switch_only(tmp_path):
    """The TNA program has the uplink and service_source tables; what a tree needs is one kind
    of program on all its switches (64 cells and no lanes do not pass a v1model program's
    checks, nor the reverse)."""
    (tmp_path / "tna.p4info.txtpb").write_text("")
    (tmp_path / "tna.bin").write_bytes(b"")
    program = {"p4info": "tna.p4info.txtpb", "device_config": "tna.bin", "cells_per_packet": 64}
    with pytest.raises(ConfigError, match=r"switch\[1\] \(leaf1\): its program \(256 cells"):
        tree_config(tmp_path, s0=program)
    every = {f"s{i}": program for i in range(3)}
    config = tree_config(tmp_path, **every)
    assert all(s.p4info is not None for s in config.switches)
    mixed = {**every, "s2": {**program, "cells_per_packet": 32}}
    with pytest.raises(ConfigError, match=r"\(leaf2\): its program \(32 cells a packet"):
        tree_config(tmp_path, **mixed)
    doc = tree_config_dict(ADDRESSES, tmp_path)
    for sw in doc["switch"][1:]:
        for key in ("parent", "parent_port", "port_on_parent"):
            del sw[key]
    doc["switch"][0].update(program)
    parse_config(doc, tmp_path)  # outside a tree any switch may run its own program


def test_world_sizes_above_32_need_a_tree(config):
    configs = {s.name: s for s in config.switches}
    assert tree_capacity(configs, "spine") == 64 and tree_capacity(configs, "leaf1") == 0
    check_world_fits(configs, 32)
    check_world_fits(configs, 64)
    check_world_fits(configs, 40, "spine")
    with pytest.raises(InvalidArgument, match="switch leaf1 cannot hold them: it has no tree"):
        check_world_fits(configs, 40, "leaf1")
    with pytest.raises(InvalidArgument, match=r"its largest tree holds 64\. Use at most 64"):
        check_world_fits(configs, 65)
    flat = {n: c for n, c in configs.items() if n == "spine"}
    with pytest.raises(InvalidArgument, match="world_size: 40 ranks need a tree of switches"):
        check_world_fits(flat, 40)


def _worker(rank: int, leaf: int, index: int, udp: int = 41000) -> JobWorker:
    host = host_entry(index, leaf)
    return JobWorker(rank, host["mac"], host["ip"], udp + rank, host["switch_port"])


def _join(switches, jobs, job, worker):
    undo = admit(switches, jobs, job, worker)
    job.workers[worker.rank] = worker
    return undo


def test_a_job_becomes_a_tree_when_a_sibling_leaf_joins(switches, config):
    job = Job(7, "tree", "0" * 64, 4, "dense", 16, 0.0)
    jobs = [job]
    _join(switches, jobs, job, _worker(0, 1, 0))
    assert (job.switch, job.leaves) == ("leaf1", {})  # flat so far
    undo = _join(switches, jobs, job, _worker(1, 2, 0))
    assert job.switch == "spine" and set(job.leaves) == {"leaf1", "leaf2"}
    assert {n: s.pools.used_ranges() for n, s in switches.items()} == {
        "spine": [(0, 16)],
        "leaf1": [(0, 16)],
        "leaf2": [(0, 16)],
    }
    del job.workers[1]
    undo()  # a join that failed after: back to flat on leaf1
    assert (job.switch, job.leaves, job.pool_base) == ("leaf1", {}, 0)
    assert switches["spine"].pools.used_ranges() == switches["leaf2"].pools.used_ranges() == []
    _join(switches, jobs, job, _worker(1, 2, 0))
    _join(switches, jobs, job, _worker(2, 1, 1))
    _join(switches, jobs, job, _worker(3, 2, 1))
    assert job.complete and [w.switch for w in job.workers.values()] == [
        "leaf1",
        "leaf2",
        "leaf1",
        "leaf2",
    ]
    assert tree_rows(job) == [
        ("spine", "parent", 0, 0, 2),
        ("leaf1", "leaf", 0, 0, 2),
        ("leaf2", "leaf", 0, 1, 2),
    ]
    unplace(switches, job)
    assert all(not s.pools.used_ranges() for s in switches.values())


def test_ranks_outside_the_tree_are_refused(switches, config, tmp_path):
    job = Job(8, "t", "0" * 64, 3, "dense", 8, 0.0)
    _join(switches, [job], job, _worker(0, 1, 0))
    _join(switches, [job], job, _worker(1, 2, 0))
    spine_host = JobWorker(2, "02:00:00:00:09:09", "10.0.100.1", 41002, 7)
    with pytest.raises(InvalidArgument, match="takes only hosts its topology lists"):
        admit(switches, [job], job, spine_host)
    # a leaf of another parent
    doc = tree_config_dict(ADDRESSES, tmp_path)
    doc["switch"].append(
        {
            "name": "other",
            "address": "127.0.0.1:4",
            "mac": "02:00:00:00:04:fe",
            "service_ip": "10.0.4.254",
            "hosts": [host_entry(0, 4)],
        }
    )
    cfg = parse_config(doc, tmp_path)
    lock = threading.RLock()
    more = {s.name: ManagedSwitch(s, lock, None) for s in cfg.switches}  # type: ignore[arg-type]
    flat = Job(9, "f", "0" * 64, 2, "dense", 8, 0.0)
    _join(more, [flat], flat, _worker(0, 1, 0))
    with pytest.raises(FailedPrecondition, match="not leaves of one parent"):
        admit(more, [flat], flat, _worker(1, 4, 0))
    assert (flat.switch, flat.leaves) == ("leaf1", {})
    assert more["spine"].pools.used_ranges() == []


def test_a_job_named_on_the_parent_runs_flat_when_its_ranks_share_a_leaf(switches):
    job = Job(10, "named", "0" * 64, 2, "dense", 8, 0.0)
    place([job], job, switches["spine"])
    _join(switches, [job], job, _worker(0, 2, 0))
    assert (job.switch, job.leaves) == ("spine", {"leaf2": 0})
    _join(switches, [job], job, _worker(1, 2, 1))  # the last rank: one leaf, no parent
    assert (job.switch, job.leaves, job.pool_base) == ("leaf2", {}, 0)
    assert switches["spine"].pools.used_ranges() == []
    assert job_entries(job, {}) == {"leaf2": job.entries()}


def test_a_leaf_holds_at_most_32_ranks_of_a_job(switches):
    job = Job(11, "big", "0" * 64, 40, "dense", 4, 0.0)
    for rank in range(32):
        _join(switches, [job], job, _worker(rank, 1, 0, udp=40000 + rank))
    with pytest.raises(ResourceExhausted, match="32 ranks on switch leaf1"):
        admit(switches, [job], job, _worker(32, 1, 1))
    _join(switches, [job], job, _worker(32, 2, 0))
    assert job.switch == "spine" and set(job.leaves) == {"leaf1", "leaf2"}


def test_each_switch_of_a_tree_gets_its_entries(switches, config):
    job = Job(12, "entries", "0" * 64, 4, "dense", 16, 0.0)
    for rank, (leaf, index) in enumerate([(2, 0), (1, 0), (2, 1), (1, 1)]):
        _join(switches, [job], job, _worker(rank, leaf, index))
    configs = {s.name: s for s in config.switches}
    got = job_entries(job, configs)
    # written parent first; rank 0's leaf has uplink rank 0
    assert list(got) == ["spine", "leaf2", "leaf1"]
    leaf1, leaf2 = configs["leaf1"], configs["leaf2"]
    assert got["spine"] == JobEntries(
        12,
        0,
        16,
        12,
        (
            Worker(0, 2, leaf2.mac, leaf2.service_ip, AGG_UDP_PORT),
            Worker(1, 1, leaf1.mac, leaf1.service_ip, AGG_UDP_PORT),
        ),
    )
    spine = configs["spine"]
    assert got["leaf1"].uplink == Uplink(UPLINK_PORT, 1, spine.service_ip, spine.mac)
    assert [w.rank for w in got["leaf1"].workers] == [1, 3]
    for entries in got.values():
        entries.validate()
    specs = {s.key: s for s in job_specs(got["leaf1"])}
    bits = {
        dict(s.match)["hdr.agg.rank"]: dict(s.params)["worker_bit"]
        for s in specs.values()
        if getattr(s, "table", "") == p4names.WORKER_TABLE
    }
    assert bits == {1: 1, 3: 2}  # 1 << the index among the leaf's workers, not 1 << rank
    [uplink] = [s for s in specs.values() if getattr(s, "table", "") == p4names.UPLINK]
    assert dict(uplink.params) == {
        "port": UPLINK_PORT,
        "rank": 1,
        "parent_ip": ipv4_to_int(spine.service_ip),
        "parent_mac": mac_to_int(spine.mac),
    }
    kinds = [stage[0].kind for stage in in_install_order(job_specs(got["leaf1"]))]
    assert kinds == [
        p4names.UPLINK,
        MULTICAST_GROUPS,
        p4names.RESULT_REWRITE,
        p4names.WORKER_TABLE,
        p4names.JOB_TABLE,
    ]
    parent = {s.key: s for s in job_specs(got["spine"])}
    assert not any(getattr(s, "table", "") == p4names.UPLINK for s in parent.values())
    [group] = [s for s in parent.values() if s.kind == MULTICAST_GROUPS]
    assert group.replicas == ((1, 2), (2, 1))  # (port_on_parent, uplink rank + 1)
    rewrites = sorted(
        (dict(s.match)["hdr.agg.rank"], dict(s.params)["ip"])
        for s in parent.values()
        if getattr(s, "table", "") == p4names.RESULT_REWRITE
    )
    assert rewrites == [(0, ipv4_to_int(leaf2.service_ip)), (1, ipv4_to_int(leaf1.service_ip))]


def test_a_flat_job_is_unchanged(switches, config):
    job = Job(13, "flat", "0" * 64, 2, "dense", 8, 0.0)
    _join(switches, [job], job, _worker(0, 1, 0))
    _join(switches, [job], job, _worker(1, 1, 1))
    configs = {s.name: s for s in config.switches}
    assert job_entries(job, configs) == {"leaf1": job.entries()}
    assert job.entries().uplink is None and tree_rows(job) == []
    specs = job_specs(job.entries())
    assert sorted(
        (dict(s.match)["hdr.agg.rank"], dict(s.params)["worker_bit"])
        for s in specs
        if getattr(s, "table", "") == p4names.WORKER_TABLE
    ) == [(0, 1), (1, 2)]


def test_entries_refuse_what_the_program_cannot_hold():
    leaf = JobEntries(1, 0, 8, 1, (Worker(40, 1, "02:00:00:00:00:01", "10.0.0.1", 1),))
    with pytest.raises(ValueError, match=r"0\.\.world_size-1"):
        leaf.validate()  # without an uplink, ranks are 0..n-1
    up = Uplink(100, 0, "10.0.0.254", "02:00:00:00:00:fe")
    replace(leaf, uplink=up).validate()  # a leaf's ranks are the job's
    with pytest.raises(ValueError, match="uplink rank 32"):
        replace(leaf, uplink=replace(up, rank=32)).validate()
    big = Worker(256, 1, "02:00:00:00:00:01", "10.0.0.1", 1)
    with pytest.raises(ValueError, match=r"in 0\.\.255"):
        replace(leaf, workers=(big,), uplink=up).validate()


def test_hosts_behind_the_tree_are_routed_toward_their_switch(config):
    configs = {s.name: s for s in config.switches}
    up = {(t.host.ip, t.port, t.next_mac) for t in transit_hosts(configs, "leaf1")}
    assert up == {
        (h["ip"], UPLINK_PORT, configs["spine"].mac) for h in map(host_entry, [0, 1], [2, 2])
    }
    down = {(t.host.ip, t.port, t.next_mac) for t in transit_hosts(configs, "spine")}
    assert down == {
        (host_entry(i, k)["ip"], k, configs[f"leaf{k}"].mac) for i in (0, 1) for k in (1, 2)
    }
    routes = [
        e
        for e in forwarding_entries(
            (), "10.0.1.254", configs["leaf1"].mac, transit_hosts(configs, "leaf1")
        )
        if e.table == p4names.IPV4_LPM and e.action == p4names.ROUTE
    ]
    assert {dict(e.params)["port"] for e in routes} == {UPLINK_PORT} and len(routes) == 2


def test_service_addresses_of_the_tree_are_let_in_only_toward_their_switch(config):
    """A leaf takes its parent's and its sibling's service address only through its uplink,
    the parent each leaf's only through the port toward it; every switch refuses its own."""
    configs = {s.name: s for s in config.switches}
    ip = {name: c.service_ip for name, c in configs.items()}
    assert peer_services(configs, "leaf1") == [
        PeerService(ip["spine"], UPLINK_PORT),
        PeerService(ip["leaf2"], UPLINK_PORT),
    ]
    assert peer_services(configs, "spine") == [
        PeerService(ip["leaf1"], 1),
        PeerService(ip["leaf2"], 2),
    ]
    entries = [
        e
        for e in forwarding_entries(
            (), ip["spine"], configs["spine"].mac, (), peer_services(configs, "spine")
        )
        if e.table == p4names.SERVICE_SOURCE
    ]
    assert [(dict(e.match), e.action, dict(e.params)) for e in entries] == [
        ({"hdr.ipv4.src_addr": ipv4_to_int(ip["spine"])}, p4names.OWN_SERVICE, {}),
        ({"hdr.ipv4.src_addr": ipv4_to_int(ip["leaf1"])}, p4names.PEER_SERVICE, {"port": 1}),
        ({"hdr.ipv4.src_addr": ipv4_to_int(ip["leaf2"])}, p4names.PEER_SERVICE, {"port": 2}),
    ]


def test_operators_see_a_tree_jobs_switches():
    from homagg.api import jobs_pb2 as pb
    from homagg.control.cli import to_dict
    from homagg.control.text_table import job_switches, render_jobs

    info = pb.JobInfo(job_id=3, name="t", state="ready", switch="spine", world_size=4, joined=4)
    for name, role, rank in (("spine", "parent", 0), ("leaf1", "leaf", 0), ("leaf2", "leaf", 1)):
        info.tree.add(switch=name, role=role, uplink_rank=rank, ranks=2)
    info.workers.add(rank=0, switch="leaf1", switch_port=1)
    assert job_switches(info) == "spine>leaf1,leaf2"
    assert "spine>leaf1,leaf2" in render_jobs([info], ranks=True)
    assert "leaf1:1" in render_jobs([info], ranks=True)
    flat = pb.JobInfo(job_id=4, name="f", state="ready", switch="s1")
    assert job_switches(flat) == "s1" and to_dict(flat)["tree"] == []
    assert to_dict(info)["tree"][2] == {
        "switch": "leaf2",
        "role": "leaf",
        "pool_base": 0,
        "uplink_rank": 1,
        "ranks": 2,
    }
