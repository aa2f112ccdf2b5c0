"""docker-compose.yml cannot run here (no Docker engine): check its structure instead: the
services, their commands, and that the files, ports and addresses they reference agree with
the repository and with the controller configuration they use; and that it is secured as
docs/controller.md (Security) asks: the controller serves TLS with an operator credential
made like `make run` makes it, publishes its port on the host's loopback only, and the
switch's P4Runtime port is reachable from the controller only."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from controller.cli import check_secured
from controller.client import ControllerClient
from controller.config import load_config
from controller.credentials import operator_token
from controller.service import ControllerServer
from testnet.switch_process import max_pool_size

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
TEMPLATE = DOCKER / "controller.toml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_images(compose):
    services = compose["services"]
    assert {"switch", "controller"} <= set(services)
    assert services["switch"]["image"].startswith("p4lang/behavioral-model")
    assert len([s for s in services if s.startswith("worker")]) >= 2
    for name, svc in services.items():
        if name != "switch":
            build = svc["build"]
            assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def test_switch_ports_match_the_controller_hosts_and_worker_links(compose):
    services = compose["services"]
    cmd = services["switch"]["command"]
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
    """BMv2's data ports lose their offloads before it opens them (testnet/rawsock.py run as a
    script: with them on, a burst of more than ~31 frames per port is lost), and the
    controller grants BMv2's pool limit (docs/bmv2.md)."""
    switch = compose["services"]["switch"]
    argv = shlex.split(switch["command"])
    assert argv[:2] == ["sh", "-c"]
    prepare, start = argv[2].split(" && ")
    ports = re.findall(r"-i \d+@(\w+)", start)
    assert start.startswith("exec simple_switch_grpc ") and ports
    mount = next(v for v in switch["volumes"] if v.startswith("./testnet/rawsock.py:"))
    script = mount.split(":")[1]
    assert prepare.split() == ["python3", script, *ports]
    assert (ROOT / "testnet" / "rawsock.py").is_file()
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
    addr = re.search(r"--grpc-server-addr ([\d.]+):\d+", switch["command"]).group(1)
    [p4rt] = [n for n, v in switch["networks"].items() if v.get("ipv4_address") == addr]
    assert networks[p4rt].get("internal") is True
    members = {name for name, svc in services.items() if p4rt in svc["networks"]}
    assert members == {"switch", "controller"}
    assert "0.0.0.0" not in switch["command"]


def test_workers_verify_tls_and_only_rank_0_holds_the_operator_credential(compose):
    script = (ROOT / "docker" / "worker.sh").read_text()
    assert "--insecure" not in script and "--insecure" not in str(compose)
    assert "export HOMAGG_CA_FILE=/credentials/ca.crt" in script
    rank0 = script[script.index('if [ "$RANK" = 0 ]') : script.index("\nfi\n")]
    assert script.count("operator.token") == rank0.count("operator.token") == 1
    for name, svc in compose["services"].items():
        if name.startswith("worker"):
            assert "credentials:/credentials:ro" in svc["volumes"]
    assert "credentials:/credentials" in compose["services"]["controller"]["volumes"]


def test_the_generated_controller_configuration_is_secured(tmp_path):
    """What docker/controller.sh makes on the controller's first start: TLS whose certificate
    names the service workers dial ("controller"), and the operator credential rank 0 reads;
    aggctl serve accepts it without --insecure, and a client verifying the name and
    presenting the credential gets Status."""
    spec = importlib.util.spec_from_file_location("compose_credentials", DOCKER / "credentials.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cfg = load_config(script.make_credentials(tmp_path, TEMPLATE))
    assert cfg.tls_cert == tmp_path / "server.crt" and len(cfg.operators) == 1
    check_secured(cfg, insecure=False)  # no ConfigError
    assert (tmp_path / "operator.token").stat().st_mode & 0o077 == 0
    cfg = dataclasses.replace(cfg, listen="127.0.0.1:0", database=tmp_path / "c.db")
    server = ControllerServer(cfg)
    port = server.start()
    try:
        token = operator_token(tmp_path / "operator.token")
        with ControllerClient(
            f"127.0.0.1:{port}", 5.0, tmp_path / "ca.crt", token, server_name=script.CONTROLLER_NAME
        ) as client:
            assert client.status().switches[0].name == "s1"
    finally:
        server.stop(0)
