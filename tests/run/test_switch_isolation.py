"""`make run`'s switch runs in a network namespace of its own (run/net.py P4Switch): a server
on every interface of the switch process's namespace, as BMv2's Thrift server is (table
writes without a credential, no option to bind one address), is out of every host's reach,
while the hosts still reach the controller's host through the switch. Before, the switch ran
in the root namespace, where the controller's host has its address: any worker could
connect to BMv2's Thrift port there."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from mininet_runs import mininet_reason

from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.forwarding import Host, forwarding_entries
from homagg.control.install import reconcile
from homagg.control.switch_connection import SwitchConnection
from homagg.lab.addresses import CONTROLLER_INDEX, SWITCH_MAC, host_entry
from homagg.lab.namespace import in_namespace, tcp_connects
from homagg.lab.switch_process import THRIFT_PORT, free_port

pytestmark = pytest.mark.skipif(
    bool(mininet_reason()), reason=mininet_reason() or "runs make run in Mininet"
)


def _install_forwarding(net, topo_hosts: int, names) -> None:
    """What the controller installs first (run/control.py's hosts): the pipeline and the
    routes to every host and to the controller's host (so the hosts reach each other and it
    through the switch)."""
    entries = [host_entry(i, names.number) for i in range(topo_hosts)]
    entries.append(host_entry(CONTROLLER_INDEX, names.number))
    hosts = [Host(e["ip"], e["mac"], e["switch_port"]) for e in entries]
    conn = SwitchConnection(net.switches[0].process.address, election_id=10, timeout=5.0)
    conn.connect()
    try:
        conn.set_pipeline(P4INFO_PATH, BMV2_JSON_PATH)
        entries = forwarding_entries(hosts, names.service_ip, SWITCH_MAC)
        reconcile(conn, entries, read_back=False)
    finally:
        conn.close()


@pytest.mark.timeout(180)
def test_no_host_reaches_a_server_in_the_switchs_namespace(tmp_path):
    from run.net import Topology, build, prepare_hosts
    from run.state import RunState

    state = RunState.claim()
    net = None
    try:
        net = build(Topology(hosts=2), "refswitch", tmp_path, state.names)
        net.start()
        prepare_hosts(net, sys.executable, state.names)
        names, sw = state.names, net.switches[0]
        # each host resolves the run's addresses locally (c10d's reverse lookups), in its
        # own mount namespace: the machine's /etc/hosts is untouched
        h0_shell = next(h for h in net.hosts if h.inNamespace)
        assert names.host(1) in h0_shell.cmd(f"getent hosts {names.host_ip(1)}")
        assert names.host(1) not in Path("/etc/hosts").read_text()
        assert sw.process.address.startswith("unix:/")
        _install_forwarding(net, 2, names)
        switch_ns = f"/proc/{sw.process.proc.pid}/ns/net"
        with in_namespace(switch_ns):
            thrift = socket.create_server(("0.0.0.0", THRIFT_PORT))  # BMv2's Thrift, in effect
        reachable = socket.create_server((names.controller_ip, free_port()))  # the controller's
        try:
            h0, h1 = (f"/proc/{h.pid}/ns/net" for h in net.hosts if h.inNamespace)
            assert tcp_connects(h0, names.controller_ip, reachable.getsockname()[1])
            assert tcp_connects(switch_ns, "127.0.0.1", THRIFT_PORT)  # it does listen
            for target in (names.controller_ip, names.service_ip, names.host_ip(1)):
                assert not tcp_connects(h0, target, THRIFT_PORT), target
            assert not tcp_connects(h1, names.controller_ip, THRIFT_PORT)
            assert not tcp_connects(None, names.controller_ip, THRIFT_PORT)
        finally:
            thrift.close()
            reachable.close()
    finally:
        if net is not None:
            net.stop()
        state.clear()
