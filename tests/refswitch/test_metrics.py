"""A switch process's own metrics (--metrics-port): the /proc/net/dev parser, the families
and their labels, and a real switch of each target that serves them on its namespace's
loopback, counting what was sent to it."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from homagg.lab.aggjob import Job, random_cells
from homagg.lab.fabric import Fabric
from homagg.lab.namespace import have_privileges, in_namespace
from homagg.lab.switch_process import ebpf_problem, switch_command
from homagg.refswitch.cli import build_parser
from homagg.refswitch.metrics import SwitchCollector, interface_counters

PROC_NET_DEV = (
    "Inter-|   Receive                            |  Transmit\n"
    " face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop ...\n"
    "    lo:    1000      10    0    0    0     0    0    0     1000      10    0 0 0 0 0 0\n"
    "hg1s0: 5000 50 0 3 0 0 0 0 7000 70 0 0 0 0 0 0\n"
)
METRICS_PORT = 9464  # on the switch namespace's own loopback: no other process there


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_interface_counters_parse_proc_net_dev():
    assert interface_counters(PROC_NET_DEV) == {"lo": (10, 0, 10), "hg1s0": (50, 3, 70)}


def test_families_and_labels(tmp_path):
    dev = tmp_path / "dev"
    dev.write_text(PROC_NET_DEV)
    registry = CollectorRegistry()
    registry.register(
        SwitchCollector({1: "hg1s0", 2: "gone"}, lambda: {"UNKNOWN_JOB": 4}, lambda: {1: 2}, dev)
    )
    fams = families(generate_latest(registry).decode())
    by_port = {
        name: {s.labels["port"]: s.value for s in fams[name].samples if s.name.endswith("_total")}
        for name in (
            "homagg_switch_port_received_packets",
            "homagg_switch_port_sent_packets",
            "homagg_switch_port_interface_drops",
            "homagg_switch_port_socket_overflows",
        )
    }
    assert by_port == {  # a port whose interface is gone has no sample
        "homagg_switch_port_received_packets": {"1": 50},
        "homagg_switch_port_sent_packets": {"1": 70},
        "homagg_switch_port_interface_drops": {"1": 3},
        "homagg_switch_port_socket_overflows": {"1": 2},
    }
    [drop] = [s for s in fams["homagg_switch_pipeline_drops"].samples if s.name.endswith("_total")]
    assert drop.labels == {"reason": "UNKNOWN_JOB"} and drop.value == 4
    assert all(f.type == "counter" for f in fams.values())


def test_metrics_are_off_unless_asked_and_on_loopback():
    args = build_parser().parse_args([])
    assert args.metrics_port is None and args.metrics_addr == "127.0.0.1"
    assert "--metrics-port" not in switch_command("refswitch", {}, "unix:/x")
    assert switch_command("ebpf", {}, "unix:/x", metrics_port=9)[-2:] == ["--metrics-port", "9"]
    with pytest.raises(ValueError, match="serves no metrics"):
        switch_command("bmv2", {}, "unix:/x", metrics_port=9)


def scrape(namespace: str) -> dict:
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    # the socket is made in the switch's namespace
    with in_namespace(namespace), urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return families(text)


def totals(fams: dict, name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in fams[name].samples if s.name == name + "_total"}


@pytest.mark.skipif(not have_privileges(), reason="a switch on veth ports needs root")
@pytest.mark.parametrize(
    "target",
    [
        "refswitch",
        pytest.param(
            "ebpf",
            marks=pytest.mark.skipif(bool(ebpf_problem()), reason=f"eBPF: {ebpf_problem()}"),
        ),
    ],
)
def test_a_switch_serves_its_metrics(target, tmp_path):
    with Fabric(target, 2, tmp_path, metrics_port=METRICS_PORT) as fabric:
        job = Job(fabric, fabric.hosts, pool_size=4)
        before = scrape(fabric.switch_namespace)
        rng = np.random.default_rng(1)
        for _ in range(5):
            fabric.hosts[0].raw.send(job.frame(0, random_cells(rng), job_id=60000))
        for r in range(2):
            fabric.hosts[r].raw.send(job.frame(r, random_cells(rng)))
        for h in fabric.hosts:
            assert len(h.raw.receive(2.0, count=1)) == 1  # the result
        deadline = time.monotonic() + 5
        while True:  # the kernel and the switch count as the frames pass
            after = scrape(fabric.switch_namespace)
            drops = totals(after, "homagg_switch_pipeline_drops", "reason")
            if drops.get("UNKNOWN_JOB", 0) >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert drops["UNKNOWN_JOB"] == 5
    port = [str(h.switch_port) for h in fabric.hosts]
    rx0 = totals(before, "homagg_switch_port_received_packets", "port")
    rx1 = totals(after, "homagg_switch_port_received_packets", "port")
    tx0 = totals(before, "homagg_switch_port_sent_packets", "port")
    tx1 = totals(after, "homagg_switch_port_sent_packets", "port")
    assert rx1[port[0]] - rx0[port[0]] >= 6 and rx1[port[1]] - rx0[port[1]] >= 1
    assert all(tx1[p] - tx0[p] >= 1 for p in port)  # each rank's result
    assert ("homagg_switch_port_socket_overflows" in after) == (target == "refswitch")
