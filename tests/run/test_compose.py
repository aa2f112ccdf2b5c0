"""docker-compose.yml cannot run here (no Docker engine): check its structure instead: the
services, their commands, and that the files, ports and addresses they reference agree with
the repository and with the controller configuration they use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.config import load_config

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]


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
    grpc_port = re.search(r"--grpc-server-addr 0\.0\.0\.0:(\d+)", cmd).group(1)
    cfg_path = ROOT / services["controller"]["command"][-1]
    cfg = load_config(cfg_path)
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
    listen_port = load_config(ROOT / "docker" / "controller.toml").listen.rsplit(":", 1)[1]
    assert f"controller:{listen_port}" in script
    assert compose["services"]["controller"]["ports"] == [f"{listen_port}:{listen_port}"]
    for module in re.findall(r"python -m ([\w.]+)", script):
        assert (
            (ROOT / module.replace(".", "/")).with_suffix(".py").exists()
            or (ROOT / module.replace(".", "/")).is_dir()
            or module.startswith("torch.")
        ), module
    assert "--mode switch" in script and "--iface eth1" in script


def test_the_job_token_never_rides_a_command_line():
    script = (ROOT / "docker" / "worker.sh").read_text()
    assert not re.search(r"--token\b(?!-)", script) and "TOKEN=$(" not in script
    assert "--token-file /shared/job.token" in script
    assert "HOMAGG_TOKEN_FILE=/shared/job.token" in script
