"""The controller of a `make run`: its configuration (the switch, the run's hosts and its
own host on the address scheme of homagg/lab/addresses.py, the TLS keys and the operator),
its process on the controller's host, and the switch counters as the operator reads them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homagg.api.client import DEFAULT_PORT
from homagg.lab import REPO_ROOT
from homagg.lab.addresses import CONTROLLER_INDEX, SWITCH_MAC, host_entry
from run.credentials import RunCredentials
from run.names import RunNames

if TYPE_CHECKING:
    from mininet.net import Mininet

    from homagg.lab.controller_process import ControllerProcess
    from homagg.lab.switch_process import SwitchProcess


METRICS_PORT_BASE = 9700  # run N's controller serves its metrics on 127.0.0.1:9700+N


def controller_address(names: RunNames) -> str:
    """host:port of run `names`' controller."""
    return f"{names.controller_ip}:{DEFAULT_PORT}"


def metrics_url(names: RunNames) -> str:
    """Where run `names`' controller serves its Prometheus metrics (loopback of the root
    namespace, where it runs; docs/controller.md, Metrics)."""
    return f"http://127.0.0.1:{METRICS_PORT_BASE + names.number}/metrics"


def controller_toml(
    switch: SwitchProcess,
    hosts: list[dict[str, Any]],
    out: Path,
    names: RunNames,
    creds: RunCredentials,
) -> str:
    """The controller's configuration: one switch with `hosts` (homagg.lab.addresses.host_entry
    dicts), its database in `out`, TLS and the operator from `creds`."""
    from homagg.lab.controller_process import config_toml
    from homagg.lab.switch_process import max_pool_size

    return config_toml(
        {
            "controller": {
                "listen": controller_address(names),
                "database": str(out / "controller.db"),
                "heartbeat_interval": 1.0,
                "lease": 10.0,
                "join_timeout": 120.0,
                "metrics_listen": f"127.0.0.1:{METRICS_PORT_BASE + names.number}",
                **creds.controller_keys(),
            },
            "operator": creds.operators(),
            "switch": [
                {
                    "name": "s1",
                    "address": switch.address,
                    "max_pool_size": max_pool_size(switch.target),  # docs/bmv2.md
                    "mac": SWITCH_MAC,
                    "service_ip": names.service_ip,
                    "hosts": hosts,
                }
            ],
        }
    )


def controller_process(
    net: Mininet, hosts: int, out: Path, names: RunNames, creds: RunCredentials
) -> ControllerProcess:
    """`aggctl serve` for the controller's host (root namespace), on TLS with the run's
    tenant and admin credentials: its configuration written, not started yet."""
    from homagg.api.credentials import operator_token
    from homagg.lab.controller_process import ControllerProcess

    entries = [host_entry(i, names.number) for i in range(hosts)]
    entries.append(host_entry(CONTROLLER_INDEX, names.number))  # reached through the switch
    cfg = out / "controller.toml"
    cfg.write_text(controller_toml(net.switches[0].process, entries, out, names, creds))
    (out / "controller.db").unlink(missing_ok=True)
    return ControllerProcess(
        cfg,
        controller_address(names),
        out / "controller.log",
        ca=creds.ca,
        token=operator_token(creds.admin_token_file),  # it polls Status: an admin call
    )


def counters(names: RunNames, creds: RunCredentials) -> str:
    """`aggctl counters` as the operator sees it (over TLS, with the run's admin credential)."""
    address = controller_address(names)
    aggctl = [sys.executable, "-m", "homagg.control", "--controller", address, *creds.aggctl_args()]
    done = subprocess.run(
        [*aggctl, "counters"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    return done.stdout + done.stderr
