"""docker-compose.yml cannot run here (no Docker engine): check its structure instead: the
services, their commands, and that the files, ports and addresses they reference agree with
the repository and with the controller configuration they use; and that it is secured as
docs/controller.md (Security) asks: the controller serves TLS with an operator credential
made like `make run` makes it, publishes its port on the host's loopback only, and the
switch's P4Runtime port is reachable from the controller only."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from homagg.api.client import ControllerClient
from homagg.api.credentials import operator_token
from homagg.control.config import load_config
from homagg.control.serve_command import check_secured
from homagg.control.service import ControllerServer
from homagg.lab.namespace import (
    add_namespace,
    add_veth,
    delete_namespace,
    have_privileges,
    in_namespace,
    ip,
)
from homagg.lab.poll import wait_for
from homagg.lab.rawsock import open_raw, recv_frames
from homagg.lab.switch_process import max_pool_size

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
TEMPLATE = DOCKER / "controller.toml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def switch_command(compose: dict) -> str:
    """BMv2's command line: the exec line of docker/switch.sh, which the switch runs."""
    assert compose["services"]["switch"]["command"] == ["sh", "/homagg/switch.sh"]
    text = (DOCKER / "switch.sh").read_text().replace("\\\n", " ")
    return next(line for line in text.splitlines() if line.startswith("exec simple_switch_grpc"))


def test_services_and_images(compose):
    services = compose["services"]
    assert {"switch", "controller"} <= set(services)
    assert len([s for s in services if s.startswith("worker")]) >= 2
    for svc in services.values():
        build = svc["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file()
    dockerfile = (DOCKER / "switch.Dockerfile").read_text()
    assert "FROM p4lang/behavioral-model" in dockerfile and "iproute2" in dockerfile
    assert (
        "COPY docker/close_data_ports.sh docker/switch.sh homagg/lab/rawsock.py /homagg/"
        in dockerfile
    )


def test_switch_ports_match_the_controller_hosts_and_worker_links(compose):
    services = compose["services"]
    cmd = switch_command(compose)
    assert "simple_switch_grpc" in cmd and "--no-p4" in cmd
    ports = {int(p): iface for p, iface in re.findall(r"-i (\d+)@(\w+)", cmd)}
    grpc_port = re.search(r"--grpc-server-addr [\d.]+:(\d+)", cmd).group(1)
    cfg = load_config(TEMPLATE)
    sw = cfg.switches[0]
    assert sw.address == f"switch:{grpc_port}"
    switch_nets = services["switch"]["networks"]
    iface_net = {v["interface_name"]: net for net, v in switch_nets.items()}
    workers = sorted(s for s in services if s.startswith("worker"))
    assert len(ports) == len(workers) == len(sw.hosts)
    for rank, name in enumerate(workers):
        w = services[name]
        assert w["command"][:2] == ["sh", "docker/worker.sh"] and w["command"][2:] == [
            str(rank),
            str(len(workers)),
        ]
        host = next(h for h in sw.hosts if h.switch_port == rank + 1)
        net = iface_net[ports[rank + 1]]  # the network on the switch's port rank+1
        link = w["networks"][net]
        assert link["interface_name"] == "eth1"
        assert (link["ipv4_address"], link["mac_address"]) == (host.ip, host.mac)
        assert net in compose["networks"]


def test_referenced_files_modules_and_controller_port_exist(compose):
    script = (ROOT / "docker" / "worker.sh").read_text()
    listen_port = load_config(TEMPLATE).listen.rsplit(":", 1)[1]
    assert f"controller:{listen_port}" in script
    controller = compose["services"]["controller"]
    assert controller["command"] == ["sh", "docker/controller.sh"]
    starter = (ROOT / "docker" / "controller.sh").read_text()
    assert "docker/credentials.py" in starter and "docker/controller.toml" in starter
    assert (ROOT / "docker" / "credentials.py").is_file()
    for module in re.findall(r"python -m ([\w.]+)", script + starter):
        assert (
            (ROOT / module.replace(".", "/")).with_suffix(".py").exists()
            or (ROOT / module.replace(".", "/")).is_dir()
            or module.startswith("torch.")
        ), module
    assert "--mode switch" in script and "--iface eth1" in script


def test_the_switch_turns_its_ports_offloads_off_and_the_controller_paces_bmv2(compose):
    """BMv2's data ports lose their offloads before it opens them (homagg/lab/rawsock.py run as a
    script: with them on, a burst of more than ~31 frames per port is lost), and the
    controller grants BMv2's pool limit (docs/bmv2.md)."""
    script = (DOCKER / "switch.sh").read_text()
    ports = re.findall(r"-i \d+@(\w+)", switch_command(compose))
    prepare = next(line for line in script.splitlines() if line.startswith("python3 "))
    assert prepare.split() == ["python3", "/homagg/rawsock.py", *ports]
    assert script.index(prepare) < script.index("exec simple_switch_grpc")
    assert "homagg/lab/rawsock.py" in shlex.split(
        next(
            line
            for line in (DOCKER / "switch.Dockerfile").read_text().splitlines()
            if line.startswith("COPY")
        )
    )
    assert (ROOT / "homagg" / "lab" / "rawsock.py").is_file()
    assert load_config(TEMPLATE).switches[0].max_pool_size == max_pool_size("bmv2")


def test_the_job_token_never_rides_a_command_line():
    script = (ROOT / "docker" / "worker.sh").read_text()
    assert not re.search(r"--token\b(?!-)", script) and "TOKEN=$(" not in script
    assert "--token-file /shared/job.token" in script
    assert "HOMAGG_TOKEN_FILE=/shared/job.token" in script


def test_published_ports_are_on_the_hosts_loopback_only(compose):
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    listen_port = load_config(TEMPLATE).listen.rsplit(":", 1)[1]
    assert compose["services"]["controller"]["ports"] == [f"127.0.0.1:{listen_port}:{listen_port}"]


def test_p4runtime_is_reachable_from_the_controller_only(compose):
    """The switch serves P4Runtime on the address it has on a network of its own, which is
    internal (no route out) and which only the controller joins besides the switch; no worker
    shares any network with that address."""
    services, networks = compose["services"], compose["networks"]
    switch = services["switch"]
    addr = re.search(r"--grpc-server-addr ([\d.]+):\d+", switch_command(compose)).group(1)
    [p4rt] = [n for n, v in switch["networks"].items() if v.get("ipv4_address") == addr]
    assert networks[p4rt].get("internal") is True
    members = {name for name, svc in services.items() if p4rt in svc["networks"]}
    assert members == {"switch", "controller"}
    assert "0.0.0.0" not in switch_command(compose)


def test_bmv2s_thrift_port_is_closed_to_the_data_networks(compose):
    """BMv2's Thrift server binds every interface: the switch closes each data port (every
    -i interface) to its kernel before BMv2 starts, and has no IPv6."""
    script = (DOCKER / "switch.sh").read_text()
    cmd = switch_command(compose)
    ifaces = re.findall(r"-i \d+@(\w+)", cmd)
    assert f"sh /homagg/close_data_ports.sh {' '.join(ifaces)}\n" in script
    assert script.index("close_data_ports.sh") < script.index("exec simple_switch_grpc")
    assert re.search(r"--thrift-port (\d+)", cmd).group(1) == "9090"
    switch = compose["services"]["switch"]
    assert switch["sysctls"]["net.ipv6.conf.all.disable_ipv6"] == 1
    assert "NET_ADMIN" in switch["cap_add"]


def test_workers_verify_tls_and_only_rank_0_holds_the_operator_credential(compose):
    script = (ROOT / "docker" / "worker.sh").read_text()
    assert "--insecure" not in script and "--insecure" not in str(compose)
    assert "export HOMAGG_CA_FILE=/credentials/ca.crt" in script
    rank0 = script[script.index('if [ "$RANK" = 0 ]') : script.index("\nfi\n")]
    assert script.count("tenant.token") == rank0.count("tenant.token") == 1
    assert "admin" not in script
    for name, svc in compose["services"].items():
        if name.startswith("worker"):
            assert "credentials:/credentials:ro" in svc["volumes"]
            assert not any(v.startswith("admin:") for v in svc["volumes"])
    volumes = compose["services"]["controller"]["volumes"]
    assert "credentials:/credentials" in volumes and "admin:/admin" in volumes


@pytest.mark.slow
def test_the_generated_controller_configuration_is_secured(tmp_path):
    """What docker/controller.sh makes on the controller's first start: TLS whose certificate
    names the service workers dial ("controller"), the tenant credential rank 0 reads and the
    admin credential in the controller's own volume; aggctl serve accepts it without
    --insecure, and a client verifying the name and presenting the admin credential gets
    Status."""
    spec = importlib.util.spec_from_file_location("compose_credentials", DOCKER / "credentials.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cfg = load_config(script.make_credentials(tmp_path, TEMPLATE, tmp_path / "admin"))
    assert cfg.tls_cert == tmp_path / "server.crt"
    assert [(o.name, o.role) for o in cfg.operators] == [
        ("make-run", "tenant"),
        ("make-run-admin", "admin"),
    ]
    check_secured(cfg, insecure=False)  # no ConfigError
    assert (tmp_path / "tenant.token").stat().st_mode & 0o077 == 0
    assert not (tmp_path / "admin.token").exists()
    cfg = dataclasses.replace(cfg, listen="127.0.0.1:0", database=tmp_path / "c.db")
    server = ControllerServer(cfg)
    port = server.start()
    try:
        token = operator_token(tmp_path / "admin" / "admin.token")
        with ControllerClient(
            f"127.0.0.1:{port}", 5.0, tmp_path / "ca.crt", token, server_name=script.CONTROLLER_NAME
        ) as client:
            assert client.status().switches[0].name == "s1"
    finally:
        server.stop(0)


@pytest.mark.skipif(not have_privileges(), reason="needs root (network namespaces)")
def test_close_data_ports_leaves_thrift_to_the_p4runtime_network(tmp_path):
    """docker/close_data_ports.sh in namespaces shaped like the compose switch (a data port
    with an address, the p4runtime network's address) with a server on every interface (as
    BMv2's Thrift): before, a worker reaches it at both addresses (Linux answers for any of
    its addresses on any interface); after, at neither, while the controller's network
    still does and frames still reach a packet socket on the data port (BMv2's libpcap)."""
    tag = f"hgd{os.getpid() % 100000}"
    sw, worker, ctl = f"{tag}s", f"{tag}w", f"{tag}c"
    for ns in (sw, worker, ctl):
        add_namespace(ns)
    try:
        add_veth("data1", "eth1", worker, sw)
        add_veth("p4rt", "eth0", ctl, sw)
        for ns, iface, addr in [
            (sw, "data1", "10.0.1.254/24"),
            (worker, "eth1", "10.0.1.2/24"),
            (sw, "p4rt", "192.168.59.2/24"),
            (ctl, "eth0", "192.168.59.3/24"),
        ]:
            ip("addr", "add", addr, "dev", iface, netns=ns)
        ip("route", "add", "192.168.59.0/24", "via", "10.0.1.254", netns=worker)
        with in_namespace(sw):
            thrift = socket.create_server(("0.0.0.0", 9090))
            port = open_raw("data1")
        try:
            assert _connects(worker, "10.0.1.254") and _connects(worker, "192.168.59.2")
            done = subprocess.run(
                ["ip", "netns", "exec", sw, "sh", str(DOCKER / "close_data_ports.sh"), "data1"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            assert done.returncode == 0, done.stderr
            assert not _connects(worker, "10.0.1.254") and not _connects(worker, "192.168.59.2")
            assert _connects(ctl, "192.168.59.2") and _connects(sw, "127.0.0.1")
            recv_frames(port, limit=1000)  # what the connection attempts left
            with in_namespace(worker):
                sender = open_raw("eth1")
            sender.send(FRAME)
            sender.close()
            wait_for(lambda: FRAME in recv_frames(port, limit=10), 2, "the frame on the port")
        finally:
            thrift.close()
            port.close()
    finally:
        for ns in (sw, worker, ctl):
            delete_namespace(ns)


FRAME = bytes.fromhex("ffffffffffff02000000000288b5") + bytes(50)  # local experimental


def _connects(netns: str, host: str) -> bool:
    """Whether a TCP connection from `netns` to host:9090 succeeds within 1 s."""
    with in_namespace(netns):
        sock = socket.socket()
    try:
        sock.settimeout(1.0)
        sock.connect((host, 9090))
        return True
    except OSError:
        return False
    finally:
        sock.close()
