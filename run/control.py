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
from homagg.api.credentials import TENANT_MAX_SLOTS
from homagg.control.config import ControllerConfig
from homagg.lab import REPO_ROOT
from homagg.lab.addresses import CONTROLLER_INDEX, SWITCH_MAC, host_entry
from run.credentials import TENANT_MAX_RUN_JOBS, RunCredentials
from run.names import RunNames

if TYPE_CHECKING:
    from mininet.net import Mininet

    from homagg.lab.controller_process import ControllerProcess
    from run.net import Topology


# aggctl counters' first wait, s (a second try waits twice as long): a Python start-up and
# one read of the switch's counters, which took over 30 s at load ~50 (`--counters-timeout`)
COUNTERS_TIMEOUT_S = 30.0
METRICS_PORT_BASE = 9700  # run N's controller serves its metrics on 127.0.0.1:9700+N


def run_pool_size(switches: int) -> int:
    """The pool of make run's job on `switches` switches (a tree's job holds its pool on
    each): the controller's default, as a --script's job gets, but no more than leaves the
    tenant's slot quota room for TENANT_MAX_RUN_JOBS such jobs (30 on a 16-leaf tree).
    Measured against 8 and 256: docs/performance.md, "make run's pool"."""
    room = TENANT_MAX_SLOTS // (TENANT_MAX_RUN_JOBS * switches)
    return min(ControllerConfig.default_pool_size, room)


def controller_address(names: RunNames) -> str:
    """host:port of run `names`' controller."""
    return f"{names.controller_ip}:{DEFAULT_PORT}"


def metrics_url(names: RunNames) -> str:
    """Where run `names`' controller serves its Prometheus metrics (loopback of the root
    namespace, where it runs; docs/controller.md, Metrics)."""
    return f"http://127.0.0.1:{METRICS_PORT_BASE + names.number}/metrics"


def switch_tables(
    net: Mininet, topo: Topology, hosts: list[dict[str, Any]], names: RunNames
) -> list[dict[str, Any]]:
    """The [[switch]] tables of run `names`: its one switch with every host; or the spine with
    the controller's host (the last of `hosts`) and each leaf with its hosts on its own ports,
    named as a leaf of the spine (docs/controller.md, Trees of switches)."""
    from homagg.lab.switch_process import max_pool_size
    from run.net import UPLINK_PORT

    process = {s.name: s.process for s in net.switches}

    def table(name: str, mac: str, service_ip: str, on: list[dict[str, Any]]) -> dict[str, Any]:
        sw = process[name]
        return {
            "name": name,
            "address": sw.address,
            "max_pool_size": max_pool_size(sw.target),  # docs/bmv2.md
            "mac": mac,
            "service_ip": service_ip,
            "hosts": on,
        }

    if not topo.leaves:
        return [table(names.switch, SWITCH_MAC, names.service_ip, hosts)]
    *workers, controller = hosts
    tables = [table(names.switch, SWITCH_MAC, names.service_ip, [controller])]
    for k in range(topo.leaves):
        on = [
            {**h, "switch_port": topo.place(i)[1]}
            for i, h in enumerate(workers)
            if topo.place(i)[0] == k
        ]
        leaf = table(
            names.leaf(k), f"02:00:00:00:{0x10 + k + 1:02x}:fe", names.leaf_service_ip(k), on
        )
        leaf.update(parent=names.switch, parent_port=UPLINK_PORT, port_on_parent=k + 1)
        tables.append(leaf)
    return tables


def controller_toml(
    switches: list[dict[str, Any]],
    out: Path,
    names: RunNames,
    creds: RunCredentials,
    pool_size: int = ControllerConfig.default_pool_size,
) -> str:
    """The controller's configuration: the run's `switches` ([[switch]] tables), its database
    in `out`, TLS and the operator from `creds`, and `pool_size` as the pool of a job that
    names none (a --script's: its homagg.attach asks for the controller's default)."""
    from homagg.lab.controller_process import config_toml

    return config_toml(
        {
            "controller": {
                "listen": controller_address(names),
                "database": str(out / "controller.db"),
                "heartbeat_interval": 1.0,
                "lease": 10.0,
                "join_timeout": 120.0,
                "default_pool_size": pool_size,
                "metrics_listen": f"127.0.0.1:{METRICS_PORT_BASE + names.number}",
                **creds.controller_keys(),
            },
            "operator": creds.operators(),
            "switch": switches,
        }
    )


def controller_process(
    net: Mininet,
    topo: Topology,
    out: Path,
    names: RunNames,
    creds: RunCredentials,
    pool_size: int,
) -> ControllerProcess:
    """`aggctl serve` for the controller's host (root namespace), on TLS with the run's
    tenant and admin credentials: its configuration written, not started yet."""
    from homagg.api.credentials import operator_token
    from homagg.lab.controller_process import ControllerProcess

    entries = [host_entry(i, names.number) for i in range(topo.hosts)]
    entries.append(host_entry(CONTROLLER_INDEX, names.number))  # reached through the switch
    cfg = out / "controller.toml"
    tables = switch_tables(net, topo, entries, names)
    cfg.write_text(controller_toml(tables, out, names, creds, pool_size))
    (out / "controller.db").unlink(missing_ok=True)
    return ControllerProcess(
        cfg,
        controller_address(names),
        out / "controller.log",
        ca=creds.ca,
        token=operator_token(creds.admin_token_file),  # it polls Status: an admin call
    )


def counters(names: RunNames, creds: RunCredentials, timeout: float = COUNTERS_TIMEOUT_S) -> str:
    """`aggctl counters` as the operator sees it (over TLS, with the run's admin credential),
    within `timeout` s (`output_within`: a second try, then a line saying what to do)."""
    address = controller_address(names)
    aggctl = [sys.executable, "-m", "homagg.control", "--controller", address, *creds.aggctl_args()]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return output_within([*aggctl, "counters"], timeout, env, "--counters-timeout")


def output_within(argv: list[str], timeout: float, env: dict[str, str], option: str) -> str:
    """What `argv` printed (stdout, then stderr), given `timeout` s, then twice that once more
    (a load spike passes, and its imports are in the page cache by then). A command that never
    answers is no failed run: the text says so, how loaded the machine was and which `option`
    (its timeout) to raise."""
    for wait in (timeout, 2 * timeout):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=wait, env=env)
            return done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            continue
    load = os.getloadavg()[0]
    return (
        f"no answer within {timeout:g} s, nor within {2 * timeout:g} s on a second try (load "
        f"average {load:.1f} on {os.cpu_count()} cores): the results above stand; rerun with "
        f"{option} {4 * timeout:g}, or on a less loaded machine, to see them"
    )
