"""The controller's Prometheus metrics (docs/controller.md, Metrics): scrapes parsed with
prometheus_client's own parser (names, types and label sets stable), numbers that agree with
`aggctl counters` for the same window, job series gone with their job, nothing that names a
job or its workers, the endpoint on loopback unless explicitly exposed."""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

import grpc
import pytest
from ctl_helpers import HOSTS, join_all, make_config, rpc_code
from prometheus_client.parser import text_string_to_metric_families

from homagg.control.cli import main
from homagg.control.config import ConfigError
from homagg.control.serve_command import metrics_overrides
from homagg.metrics_endpoint import MetricsEndpoint, MetricsExposureError
from homagg.wire import p4names
from homagg.wire.constants import DropReason, Event

# name -> (type, label names): what dashboards rely on
FAMILIES = {
    "homagg_controller_jobs": ("gauge", set()),
    "homagg_controller_switch_connected": ("gauge", {"switch"}),
    "homagg_controller_switch_jobs": ("gauge", {"switch"}),
    "homagg_controller_switch_slots": ("gauge", {"switch"}),
    "homagg_controller_switch_slots_used": ("gauge", {"switch"}),
    "homagg_controller_switch_connects": ("counter", {"switch"}),
    "homagg_controller_switch_reconciliations": ("counter", {"switch"}),
    "homagg_controller_job_pool_slots": ("gauge", {"switch", "job"}),
    "homagg_controller_lease_expiries": ("counter", set()),
    "homagg_controller_port_slots_in_flight": ("gauge", {"switch", "port"}),
    "homagg_controller_port_headroom_slots": ("gauge", {"switch", "port"}),
    "homagg_controller_counters_age_seconds": ("gauge", {"switch"}),
    "homagg_controller_counter_read_errors": ("counter", {"switch"}),
    "homagg_switch_drops": ("counter", {"switch", "stage", "reason"}),
    "homagg_switch_contributions": ("counter", {"switch"}),
    "homagg_switch_results": ("counter", {"switch"}),
    "homagg_switch_resends": ("counter", {"switch"}),
    "homagg_switch_partials": ("counter", {"switch"}),
    "homagg_job_packets": ("counter", {"switch", "job"}),
    "homagg_job_bytes": ("counter", {"switch", "job"}),
    "homagg_job_rank_packets": ("counter", {"switch", "job", "rank"}),
    "homagg_switch_port_packets": ("counter", {"switch", "port"}),
    "homagg_controller_rpcs": ("counter", {"method", "code"}),
    "homagg_controller_rpc_duration_seconds": ("histogram", {"method"}),
}


def scrape(url: str) -> tuple[str, dict[str, Any]]:
    """The exposition text and its families by name."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def values(family: Any, suffix: str = "_total") -> dict[tuple, float]:
    """Samples of a family (counters: the _total samples) by their label values, sorted."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in family.samples
        if s.name == family.name + suffix or (suffix == "" and s.name == family.name)
    }


def count_on_switch(refswitch: Any, job_id: int) -> None:
    """Counts in the reference switch's counters, as traffic would leave them."""
    device = refswitch.refswitch.device
    with device.lock:
        device.counter(p4names.INGRESS_DROPS).add(DropReason.DUPLICATE, 7, 700)
        device.counter(p4names.EGRESS_DROPS).add(DropReason.NO_RECIPIENT, 2, 200)
        device.counter(p4names.EVENT_COUNTER).add(Event.CONTRIBUTION, 40)
        device.counter(p4names.EVENT_COUNTER).add(Event.RESULT, 20)
        device.counter(p4names.EVENT_COUNTER).add(Event.RESENT, 3)
        for entry in device.table(p4names.JOB_TABLE).entries():
            entry.packets, entry.bytes = 40, 40_000
        for entry in device.table(p4names.WORKER_TABLE).entries():
            entry.packets = 10 + entry.match[1][0]  # (job id, rank): (value, mask) each


def test_scrape_agrees_with_the_counters_and_hides_names(
    refswitch, tmp_path, start_controller, capsys
):
    config = make_config(
        refswitch.address, tmp_path, metrics_listen="127.0.0.1:0", metrics_interval=60.0
    )
    ctl = start_controller(config)
    metrics = ctl.server.metrics
    assert ctl.server.metrics_url.startswith("http://127.0.0.1:")  # loopback by default
    c = ctl.client
    job = c.create_job("secret-project-name", 2, "dense", pool_size=8)
    join_all(c, job, HOSTS[:2])
    assert rpc_code(lambda: c.counters(job_id=4242))[0] == grpc.StatusCode.NOT_FOUND
    count_on_switch(refswitch, job.job_id)
    metrics.poller.poll()  # the scheduled read, now: scrapes read only what it cached
    [sw] = c.counters().switches  # the same window: nothing counted in between
    assert main(["--insecure", "--controller", ctl.address, "counters", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)["switches"]  # what aggctl counters shows
    assert shown["jobs"][0]["packets"] == sw.jobs[0].packets == 40
    text, fams = scrape(ctl.server.metrics_url)
    for name, (kind, labels) in FAMILIES.items():
        assert fams[name].type == kind, name
        for s in fams[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s)
    for secret in ("secret-project-name", job.token, *(h["ip"] for h in HOSTS[:2])):
        assert secret not in text  # jobs by id only; never a name, a token or an address
    assert HOSTS[0]["mac"] not in text and HOSTS[0]["mac"].upper() not in text

    drops = values(fams["homagg_switch_drops"])
    for stage, listed in (("ingress", sw.ingress_drops), ("egress", sw.egress_drops)):
        for d in listed:
            key = (("reason", d.name), ("stage", stage), ("switch", "s1"))
            assert drops[key] == d.packets
    assert drops[(("reason", "DUPLICATE"), ("stage", "ingress"), ("switch", "s1"))] == 7
    events = {e.name: e.packets for e in sw.events}
    for event, name in (
        ("CONTRIBUTION", "contributions"),
        ("RESULT", "results"),
        ("RESENT", "resends"),
        ("PARTIAL", "partials"),
    ):
        assert values(fams[f"homagg_switch_{name}"]) == {(("switch", "s1"),): events[event]}
    [counted] = sw.jobs
    jid = str(job.job_id)
    assert values(fams["homagg_job_packets"]) == {(("job", jid), ("switch", "s1")): counted.packets}
    assert values(fams["homagg_job_bytes"]) == {(("job", jid), ("switch", "s1")): counted.bytes}
    ranks = values(fams["homagg_job_rank_packets"])
    assert ranks == {
        (("job", jid), ("rank", str(w.rank)), ("switch", "s1")): w.packets for w in counted.workers
    }
    ports = {
        (("port", str(h["switch_port"])), ("switch", "s1")): 10 + r for r, h in enumerate(HOSTS[:2])
    }
    assert values(fams["homagg_switch_port_packets"]) == ports
    state = {k[0][1]: v for k, v in values(fams["homagg_controller_switch_slots_used"], "").items()}
    assert state == {"s1": 8} and values(fams["homagg_controller_jobs"], "") == {(): 1}
    in_flight = values(fams["homagg_controller_port_slots_in_flight"], "")
    assert in_flight == {k: 8 for k in ports}  # one rank a port, a pool of 8
    buffer = config.switches[0].port_buffer
    assert values(fams["homagg_controller_port_headroom_slots"], "") == {
        k: buffer - 8 for k in ports
    }
    rpcs = values(fams["homagg_controller_rpcs"])
    assert rpcs[(("code", "OK"), ("method", "CreateJob"))] == 1
    assert rpcs[(("code", "NOT_FOUND"), ("method", "GetCounters"))] == 1
    assert rpcs[(("code", "OK"), ("method", "JoinJob"))] == 2

    # a released job's series go; the port keeps what its ranks sent
    c.release(job.job_id)
    metrics.poller.poll()
    _, fams = scrape(ctl.server.metrics_url)
    for name in (
        "homagg_job_packets",
        "homagg_job_rank_packets",
        "homagg_controller_job_pool_slots",
        "homagg_controller_port_slots_in_flight",
    ):
        assert not fams[name].samples or not values(fams[name], "" if "slots" in name else "_total")
    assert values(fams["homagg_switch_port_packets"]) == ports


def test_a_lease_expiry_is_counted(refswitch, tmp_path, start_controller):
    config = make_config(refswitch.address, tmp_path, metrics_listen="127.0.0.1:0")
    ctl = start_controller(config)
    job = ctl.client.create_job("short", 1, "dense", pool_size=4)
    join_all(ctl.client, job, HOSTS[:1])
    with ctl.manager.lock:
        ctl.manager.jobs[job.job_id].workers[0].deadline = 0.0  # its lease ran out
    assert ctl.manager.expire_due() == [job.job_id]
    _, fams = scrape(ctl.server.metrics_url)
    assert values(fams["homagg_controller_lease_expiries"]) == {(): 1}


def test_metrics_stay_on_loopback_unless_exposed(tmp_path, capsys):
    with pytest.raises(ConfigError, match="not a loopback address"):
        make_config("127.0.0.1:1", tmp_path, metrics_listen="0.0.0.0:9464")
    exposed = make_config(
        "127.0.0.1:1", tmp_path, metrics_listen="0.0.0.0:9464", metrics_non_loopback=True
    )
    assert (
        exposed.metrics_non_loopback and make_config("127.0.0.1:1", tmp_path).metrics_listen == ""
    )
    with pytest.raises(MetricsExposureError, match="not a loopback address"):
        MetricsEndpoint(None, "10.1.2.3:0")  # type: ignore[arg-type]
    flags = argparse.Namespace(metrics_port=0, metrics_listen=None, metrics_non_loopback=False)
    assert metrics_overrides(exposed, flags).metrics_listen == "127.0.0.1:0"  # --metrics-port
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[[switch]]\nname = "s1"\naddress = "127.0.0.1:1"\nmac = "02:00:00:00:00:fe"\n'
        'service_ip = "10.0.0.254"\n'
    )
    assert main(["serve", "--config", str(cfg), "--insecure", "--metrics-listen", "0.0.0.0:0"]) == 2
    assert "--metrics-non-loopback" in capsys.readouterr().err
