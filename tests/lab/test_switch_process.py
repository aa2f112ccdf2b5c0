"""The switch command lines: ports, addresses and log levels (BMv2's default level costs
half its packet rate, so it must be set), and its ports' offloads (they shrink BMv2's
capture ring to 31 frames)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from homagg.environment import BMV2_OPT_ENV
from homagg.lab import rawsock, switch_process
from homagg.lab.addresses import SERVICE_IP
from homagg.lab.fabric import Fabric
from homagg.lab.namespace import (
    add_namespace,
    add_veth,
    delete_link,
    delete_namespace,
    have_privileges,
    in_namespace,
    ip,
    tcp_connects,
)
from homagg.lab.rawsock import offloads_on
from homagg.lab.switch_process import prepare_ports, switch_command


def test_bmv2_command_sets_a_quiet_log_level_and_its_ports():
    cmd = switch_command("bmv2", {2: "veth-b", 1: "veth-a"}, "unix:/run/s.sock")
    assert cmd[:5] == ["simple_switch_grpc", "-i", "1@veth-a", "-i", "2@veth-b"]
    assert cmd[cmd.index("--log-level") + 1] == "warn" and "--log-console" in cmd
    assert cmd[cmd.index("--") + 1 :] == ["--grpc-server-addr", "unix:/run/s.sock"]
    assert cmd[cmd.index("--thrift-port") + 1] == str(switch_process.THRIFT_PORT)
    debug = switch_command("bmv2", {}, "127.0.0.1:9559", log_level="debug")
    assert debug[debug.index("--log-level") + 1] == "debug"


def test_refswitch_command_and_unknown_target():
    cmd = switch_command("refswitch", {1: "a"}, "127.0.0.1:9560", device_id=3)
    assert cmd[1:3] == ["-m", "homagg.refswitch"] and cmd[cmd.index("--log-level") + 1] == "info"
    assert cmd[cmd.index("--device-id") + 1] == "3"
    with pytest.raises(ValueError, match="unknown switch target"):
        switch_command("tofino", {}, "127.0.0.1:1")


def test_auto_is_bmv2_when_installed_and_benches_compare_what_is_installed(monkeypatch):
    monkeypatch.setattr(switch_process, "ebpf_available", lambda: False)
    monkeypatch.setattr(switch_process, "bmv2_available", lambda: True)
    assert switch_process.resolve_target(switch_process.AUTO_TARGET) == "bmv2"
    assert switch_process.compared_targets() == ["refswitch", "bmv2"]
    monkeypatch.setattr(switch_process, "bmv2_available", lambda: False)
    assert switch_process.resolve_target(switch_process.AUTO_TARGET) == "refswitch"
    assert switch_process.compared_targets() == ["refswitch"]
    assert switch_process.resolve_target("bmv2-opt") == "bmv2-opt"  # a named target stays


def test_auto_is_ebpf_where_the_kernel_allows_it_and_bmv2_is_absent(monkeypatch):
    monkeypatch.setattr(switch_process, "bmv2_available", lambda: False)
    monkeypatch.setattr(switch_process, "ebpf_available", lambda: True)
    assert switch_process.resolve_target(switch_process.AUTO_TARGET) == "ebpf"
    assert switch_process.compared_targets() == ["refswitch", "ebpf"]
    monkeypatch.setattr(switch_process, "bmv2_available", lambda: True)
    assert switch_process.resolve_target(switch_process.AUTO_TARGET) == "bmv2"


def test_ebpf_command_runs_the_ebpf_switch_module():
    cmd = switch_command("ebpf", {1: "a"}, "unix:/x.sock")
    assert cmd[1:3] == ["-m", "homagg.ebpf"] and cmd[3:5] == ["-i", "1@a"]


def test_bmv2_opt_runs_the_build_under_its_prefix_with_its_libraries(monkeypatch, tmp_path):
    monkeypatch.delenv(BMV2_OPT_ENV, raising=False)
    assert "HOMAGG_BMV2_OPT" in switch_process.target_problem("bmv2-opt")
    assert "bmv2-opt" not in switch_process.available_targets()
    with pytest.raises(ValueError, match="HOMAGG_BMV2_OPT"):
        switch_command("bmv2-opt", {1: "a"}, "127.0.0.1:9559")
    monkeypatch.setenv(BMV2_OPT_ENV, str(tmp_path))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    assert "no executable" in switch_process.target_problem("bmv2-opt")
    binary = tmp_path / "bin" / "simple_switch_grpc"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert switch_process.target_problem("bmv2-opt") == ""
    assert "bmv2-opt" in switch_process.available_targets()
    cmd = switch_command("bmv2-opt", {1: "a"}, "127.0.0.1:9559")
    default = switch_command("bmv2", {1: "a"}, "127.0.0.1:9559")
    assert cmd[0] == str(binary) and cmd[1:3] == default[1:3]  # the same flags otherwise
    assert cmd[cmd.index("--log-level") + 1] == "warn"
    env = switch_process.switch_env("bmv2-opt")
    assert env is not None and env["LD_LIBRARY_PATH"] == f"{tmp_path}/lib:/opt/other"
    assert switch_process.switch_env("bmv2") is None


@pytest.mark.skipif(not have_privileges(), reason="needs root (makes a veth pair)")
def test_prepare_ports_turns_off_the_offloads_that_shrink_bmv2s_capture_ring():
    # A fresh veth has TSO/GSO on: libpcap then cuts BMv2's 2 MiB ring into 64 KiB frames
    # (31 of them), and a burst of 32+ frames on that port is lost before the switch.
    outside, inside, ns = f"hgo{os.getpid()}", f"hgi{os.getpid()}", f"hgt{os.getpid()}"
    add_namespace(ns)
    try:
        add_veth(outside, inside, ns)
        assert {"tso", "gso"} <= set(offloads_on(outside))
        prepare_ports({1: outside})
        assert offloads_on(outside) == []
    finally:
        delete_link(outside)
        delete_namespace(ns)


@pytest.mark.skipif(not have_privileges(), reason="needs root (makes a veth pair)")
def test_rawsock_turns_offloads_off_as_a_standalone_script():
    """What the Docker example's switch runs before BMv2 (docker/switch.sh): the file alone,
    in isolated mode (no repository on the path), under the image's Python 3."""
    outside, inside, ns = f"hgo{os.getpid()}", f"hgi{os.getpid()}", f"hgt{os.getpid()}"
    add_namespace(ns)
    try:
        add_veth(outside, inside, ns)
        assert offloads_on(outside)
        script = Path(rawsock.__file__)
        done = subprocess.run(
            [sys.executable, "-I", str(script), outside], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert offloads_on(outside) == []
        missing = subprocess.run(
            [sys.executable, "-I", str(script), "no-such-iface"], capture_output=True, text=True
        )
        assert missing.returncode == 1 and "no-such-iface" in missing.stderr
    finally:
        delete_link(outside)
        delete_namespace(ns)


def test_max_pool_size_per_target():
    assert switch_process.max_pool_size("bmv2") == switch_process.max_pool_size("bmv2-opt")
    assert switch_process.max_pool_size("bmv2") == 1024 < switch_process.max_pool_size("refswitch")


def test_prepare_ports_fails_when_an_offload_stays_on(monkeypatch):
    monkeypatch.setattr(rawsock, "disable_offloads", lambda iface: None)
    monkeypatch.setattr(rawsock, "offloads_on", lambda iface: ["gso"])
    with pytest.raises(RuntimeError, match=r"offloads gso stay on at switch port p1.*ethtool"):
        switch_process.prepare_ports({1: "p1"})


@pytest.mark.skipif(not have_privileges(), reason="needs root (network namespaces)")
def test_the_switch_runs_alone_in_its_namespace_and_p4runtime_on_a_unix_socket(tmp_path):
    """A fabric's switch holds its ports in a namespace of its own, without any address or
    forwarding, so a server on every interface there (BMv2's Thrift port) is reachable from
    that namespace only: not from a host at any address it knows, not from this namespace.
    P4Runtime is a Unix socket in a directory only root enters."""
    with Fabric("refswitch", 2, tmp_path) as fabric:
        ns = fabric.switch_namespace
        assert fabric.switch.address == f"unix:{switch_process.SOCKET_DIR}/{fabric.tag}.sock"
        assert switch_process.SOCKET_DIR.stat().st_mode & 0o077 == 0
        running_in = os.stat(f"/proc/{fabric.switch.proc.pid}/ns/net").st_ino
        assert running_in == os.stat(f"/run/netns/{ns}").st_ino
        for h in fabric.hosts:
            assert ip("link", "show", h.switch_iface, check=False).returncode != 0  # not here
            assert ip("link", "show", h.switch_iface, netns=ns).returncode == 0
            h.enable_ip_stack()
        addresses = ip("-o", "-4", "addr", "show", netns=ns).stdout.split()
        assert [a for a in addresses if "/" in a] == ["127.0.0.1/8"]
        with in_namespace(ns):
            assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"
            thrift = socket.create_server(("0.0.0.0", switch_process.THRIFT_PORT))
        try:
            with in_namespace(ns):
                socket.create_connection(("127.0.0.1", switch_process.THRIFT_PORT), 2).close()
            targets = [SERVICE_IP, *(h.ip for h in fabric.hosts), "127.0.0.1"]
            for h in fabric.hosts:
                for target in targets:
                    assert not tcp_connects(h.namespace, target, switch_process.THRIFT_PORT)
            assert not tcp_connects(None, "127.0.0.1", switch_process.THRIFT_PORT)
        finally:
            thrift.close()
        fabric.restart_switch()  # killed: a new one on the same socket
        socket_path = fabric.switch.socket
        assert socket_path.exists()
    assert not socket_path.exists()  # closed with the fabric


def test_make_stop_knows_a_fabrics_switch_namespace():
    """`make stop` (homagg/lab/cleanup.py) removes what dead fabrics left by TAG_PATTERN: their
    switch's namespace too, not only hosts' namespaces and links (and a tree fabric's
    links between switches)."""
    from homagg.lab.fabric import TAG_PATTERN, fabric_tag

    tag = fabric_tag(4321, 7)
    for name in (f"{tag}sw", f"{tag}h0", f"{tag}s12", f"{tag}u0", f"{tag}p1"):
        match = TAG_PATTERN.match(name)
        assert match and match.groups() == ("4321", "7"), name
    for other in (f"{tag}sx", f"{tag}", "hg1s-eth1", f"{tag}swa"):
        assert not TAG_PATTERN.match(other), other
