"""A job across a tree of three reference switches under one controller, over real gRPC and
P4Runtime: ranks on two leaves place the job on the tree, each switch holds what the design
says (read back over P4Runtime), each rank's assignment names its leaf, a release removes it
from every switch; a world of 40 is refused where no tree holds it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from ctl_helpers import UPLINK_PORT, SwitchUnderTest, job_state, rpc_code, tree_config_dict

from homagg.control.config import parse_config
from homagg.control.switch_connection import SwitchConnection
from homagg.lab.addresses import host_entry
from homagg.lab.poll import wait_for
from homagg.p4rt.bytestrings import ipv4_to_int, mac_to_int
from homagg.wire import p4names
from homagg.wire.constants import AGG_UDP_PORT

NAMES = ("spine", "leaf1", "leaf2")


@pytest.fixture
def tree(tmp_path: Path, start_controller):
    switches = [SwitchUnderTest("refswitch", tmp_path) for _ in NAMES]
    doc = tree_config_dict(tuple(s.address for s in switches), tmp_path)  # type: ignore[arg-type]
    ctl = start_controller(parse_config(doc, tmp_path))
    readers = {}
    for name, sw in zip(NAMES, switches, strict=True):
        conn = SwitchConnection(sw.address, election_id=1, timeout=3.0)
        conn.connect(require_primary=False)
        readers[name] = conn
    yield ctl, readers, dict(zip(NAMES, switches, strict=True))
    for conn in readers.values():
        conn.close()
    for sw in switches:
        sw.stop()


def uplinks(conn: SwitchConnection) -> dict[int, dict]:
    return {e.match["hdr.agg.job_id"]: e.params for e in conn.read_entries(p4names.UPLINK)}


def test_a_job_on_two_leaves_is_written_to_the_tree(tree):
    ctl, readers, _ = tree
    c, configs = ctl.client, ctl.manager.configs
    job = c.create_job("tree", 4, "dense", pool_size=16)
    ranks = [(1, 0), (2, 0), (1, 1), (2, 1)]  # (leaf, host index)
    for rank, (leaf, index) in enumerate(ranks):
        h = host_entry(index, leaf)
        c.join(job.job_id, job.token, rank, h["mac"], h["ip"], 41000 + rank, h["switch_port"])
    got = [c.wait_ready(job.job_id, job.token, r, 10) for r in range(4)]
    assert [(a.switch, a.service_ip, a.switch_mac) for a in got] == [
        (f"leaf{leaf}", configs[f"leaf{leaf}"].service_ip, configs[f"leaf{leaf}"].mac)
        for leaf, _ in ranks
    ]
    [info] = c.list_jobs().jobs
    assert (info.switch, info.state) == ("spine", "ready")
    assert [(t.switch, t.role, t.uplink_rank, t.ranks) for t in info.tree] == [
        ("spine", "parent", 0, 2),
        ("leaf1", "leaf", 0, 2),
        ("leaf2", "leaf", 1, 2),
    ]
    assert [w.switch for w in info.workers] == ["leaf1", "leaf2", "leaf1", "leaf2"]
    assert {s.name: s.parent for s in c.status().switches} == {
        "spine": "",
        "leaf1": "spine",
        "leaf2": "spine",
    }
    jid = job.job_id
    spine = job_state(readers["spine"])
    assert spine["jobs"][jid]["num_workers"] == 2 and uplinks(readers["spine"]) == {}
    assert spine["workers"] == spine["rewrites"] == [(jid, 0), (jid, 1)]
    assert sorted(spine["groups"][jid]) == [(1, 1), (2, 2)]  # port_on_parent, uplink rank + 1
    rewrite = {
        e.match["hdr.agg.rank"]: e.params
        for e in readers["spine"].read_entries(p4names.RESULT_REWRITE)
    }
    assert rewrite[1] == {
        "mac": mac_to_int(configs["leaf2"].mac),
        "ip": ipv4_to_int(configs["leaf2"].service_ip),
        "udp_port": AGG_UDP_PORT,
    }
    for k, leaf in enumerate(("leaf1", "leaf2")):
        state = job_state(readers[leaf])
        mine = [r for r, (lf, _) in enumerate(ranks) if lf == k + 1]
        assert state["jobs"][jid]["num_workers"] == 2
        assert state["workers"] == [(jid, r) for r in mine]
        assert uplinks(readers[leaf]) == {
            jid: {
                "port": UPLINK_PORT,
                "rank": k,
                "parent_ip": ipv4_to_int(configs["spine"].service_ip),
                "parent_mac": mac_to_int(configs["spine"].mac),
            }
        }
        bits = {
            e.match["hdr.agg.rank"]: e.params["worker_bit"]
            for e in readers[leaf].read_entries(p4names.WORKER_TABLE)
        }
        assert bits == {mine[0]: 1, mine[1]: 2}
    c.release(jid)
    for name, conn in readers.items():
        state = job_state(conn)
        assert (state["jobs"], state["workers"], state["groups"], uplinks(conn)) == (
            {},
            [],
            {},
            {},
        ), name
    assert {s.name: s.slots_used for s in c.status().switches} == dict.fromkeys(NAMES, 0)


def test_every_switch_checks_the_service_sources_of_its_tree(tree):
    """The controller writes service_source with the forwarding entries: each switch refuses
    its own service address, a leaf takes the other service addresses through its uplink,
    the parent each leaf's through the port toward it."""
    ctl, readers, _ = tree
    ip = {name: ipv4_to_int(c.service_ip) for name, c in ctl.manager.configs.items()}
    want = {
        "spine": {ip["spine"]: None, ip["leaf1"]: 1, ip["leaf2"]: 2},
        "leaf1": {ip["leaf1"]: None, ip["spine"]: UPLINK_PORT, ip["leaf2"]: UPLINK_PORT},
        "leaf2": {ip["leaf2"]: None, ip["spine"]: UPLINK_PORT, ip["leaf1"]: UPLINK_PORT},
    }

    def held(conn: SwitchConnection) -> dict[int, int | None]:
        entries = conn.read_entries(p4names.SERVICE_SOURCE)
        return {e.match["hdr.ipv4.src_addr"]: e.params.get("port") for e in entries}

    for name, conn in readers.items():  # written when the controller first syncs the switch
        wait_for(lambda c=conn, n=name: held(c) == want[n], 10, f"{name}'s service_source")


def test_a_world_of_40_needs_the_tree(tree):
    ctl, _, _ = tree
    c = ctl.client
    code, details = rpc_code(lambda: c.create_job("big", 40, "dense", switch="leaf1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "need a tree of switches" in details
    code, details = rpc_code(lambda: c.create_job("huge", 65, "dense"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "largest tree holds 64" in details
    assert c.create_job("big", 40, "dense").switch == ""  # placed as its ranks join


def test_a_restarted_leaf_gets_its_part_of_the_tree_back(tree):
    """A leaf that lost its state (a reboot) is reconciled like any switch: its uplink, its
    job entries and the routes to the other leaf's hosts come back; the job is ready again."""
    ctl, readers, switches = tree
    c = ctl.client
    job = c.create_job("tree", 2, "dense", pool_size=8)
    for rank, leaf in enumerate((1, 2)):
        h = host_entry(0, leaf)
        c.join(job.job_id, job.token, rank, h["mac"], h["ip"], 41000 + rank, h["switch_port"])
    before = (job_state(readers["leaf2"]), uplinks(readers["leaf2"]))
    routes = {
        e.match["hdr.ipv4.dst_addr"][0]: e.params
        for e in readers["leaf2"].read_entries(p4names.IPV4_LPM)
        if e.action == p4names.ROUTE
    }
    assert routes[ipv4_to_int(host_entry(0, 1)["ip"])]["port"] == UPLINK_PORT
    readers["leaf2"].close()
    switches["leaf2"].restart()
    wait_for(
        lambda: (
            c.list_jobs().jobs[0].state == "ready" and all(s.connected for s in c.status().switches)
        ),
        15,
        "the controller to re-install the restarted leaf",
    )
    conn = SwitchConnection(switches["leaf2"].address, election_id=1, timeout=3.0)
    conn.connect(require_primary=False)
    readers["leaf2"] = conn
    assert (job_state(conn), uplinks(conn)) == before
