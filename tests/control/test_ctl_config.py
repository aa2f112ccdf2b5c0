"""The configuration file: the shipped example parses, and each kind of mistake is an error that
names the key."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import pytest

from homagg.control.config import ConfigError, load_config, parse_config
from homagg.wire.constants import CELLS_PER_PKT

EXAMPLE = Path(__file__).resolve().parents[2] / "homagg" / "control" / "example.toml"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "controller.md"


def test_example_parses():
    cfg = load_config(EXAMPLE)
    assert cfg.listen == "127.0.0.1:50051" and cfg.lease == 10.0 and cfg.heartbeat_interval == 2.0
    [sw] = cfg.switches
    assert (sw.name, sw.address, sw.election_id, sw.service_ip) == (
        "s1",
        "127.0.0.1:9559",
        10,
        "10.0.0.254",
    )
    assert [(h.ip, h.switch_port) for h in sw.hosts] == [("10.0.0.1", 1), ("10.0.0.2", 2)]
    assert (
        sw.host_by_ip("10.0.0.2").mac == "02:00:00:00:01:02" and sw.host_by_ip("10.0.0.3") is None
    )
    assert cfg.switch("s1") is sw and cfg.switch("s2") is None
    assert sw.max_pool_size == 4096  # every slot: no per-port limit (BMv2's: docs/bmv2.md)


def test_the_examples_secured_lines_parse(tmp_path):
    """Uncommented, the example's TLS and [[operator]] lines are a valid secured config."""
    text = re.sub(r"(?m)^#(\w|\[\[)", r"\1", EXAMPLE.read_text())
    cfg = parse_config(tomllib.loads(text), EXAMPLE.parent)
    assert cfg.tls_cert == EXAMPLE.parent / "tls" / "server.crt" and cfg.tls_key is not None
    admin, tenant = cfg.operators
    assert (admin.name, admin.role, admin.max_jobs, admin.max_slots) == ("ops", "admin", 0, 0)
    assert (tenant.name, tenant.role, tenant.max_jobs, tenant.max_slots) == (
        "team-a",
        "tenant",
        8,
        1024,
    )


def test_docs_show_the_example():
    assert EXAMPLE.read_text().split("\n", 2)[2] in DOCS.read_text()


def test_relative_database_is_next_to_the_file(tmp_path):
    doc = tomllib.loads(EXAMPLE.read_text())
    doc["controller"]["database"] = "state/ctl.db"
    assert parse_config(doc, tmp_path).database == tmp_path / "state" / "ctl.db"
    del doc["controller"]
    cfg = parse_config(doc, tmp_path)
    assert cfg.database == tmp_path / "homagg-controller.db" and cfg.default_pool_size == 64


def _set(path: str, value):
    def mutate(doc):
        node = doc
        *parents, last = path.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value

    return mutate


BAD = {
    "no switch": (_set("switch", []), "no [[switch]]"),
    "missing address": (_set("switch.0.address", KeyError), "missing key 'address'"),
    "unknown key": (_set("controller.leese", 3.0), "unknown key(s) leese"),
    "bad mac": (_set("switch.0.mac", "02:00:00"), "switch[0].mac"),
    "bad service ip": (_set("switch.0.service_ip", "10.0.0.300"), "switch[0].service_ip"),
    "bad host ip": (_set("switch.0.hosts.1.ip", "nope"), "hosts[1].ip"),
    "host port range": (
        _set("switch.0.hosts.0.switch_port", 512),
        "hosts[0].switch_port: 512 outside 0..510",
    ),
    "host on the drop port": (
        _set("switch.0.hosts.0.switch_port", 511),
        "hosts[0].switch_port: 511 outside 0..510",
    ),
    "more jobs than job ids": (
        _set("operator", [{"name": "ops", "token_sha256": "a" * 64, "max_jobs": 65536}]),
        "max_jobs: 65536 outside 0..65535",
    ),
    "host port missing": (
        _set("switch.0.hosts.0.switch_port", KeyError),
        "missing key 'switch_port'",
    ),
    "duplicate host": (_set("switch.0.hosts.1.ip", "10.0.0.1"), "10.0.0.1 is listed twice"),
    "service ip is a host": (_set("switch.0.service_ip", "10.0.0.2"), "also a host's address"),
    "bad address": (_set("switch.0.address", "localhost"), "expected HOST:PORT"),
    "port 0 for a switch": (_set("switch.0.address", "127.0.0.1:0"), "expected HOST:PORT"),
    "relative unix socket": (_set("switch.0.address", "unix:s.sock"), "unix:/ABSOLUTE/PATH"),
    "unix socket path too long": (
        _set("switch.0.address", "unix:/" + "x" * 108),
        "at most 107 characters",
    ),
    "bad name": (_set("switch.0.name", "s 1"), "is not 1..32"),
    "wrong type": (_set("controller.lease", "10"), "controller.lease: expected int or float"),
    "bool is not a number": (_set("switch.0.device_id", True), "device_id: expected int"),
    "negative seconds": (_set("controller.heartbeat_interval", -1), "positive number of seconds"),
    "lease too short": (_set("controller.lease", 3.0), "at least twice"),
    "pool size too big": (
        _set("controller.default_pool_size", 5000),
        "default_pool_size: 5000 outside 1..4096",
    ),
    "election id 0": (_set("switch.0.election_id", 0), "election_id: 0 outside"),
    "no pool at all": (_set("switch.0.max_pool_size", 0), "max_pool_size: 0 outside 1..4096"),
    "more pool than slots": (
        _set("switch.0.max_pool_size", 4097),
        "max_pool_size: 4097 outside 1..4096",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_mistakes_name_the_key(case, tmp_path):
    mutate, fragment = BAD[case]
    doc = copy.deepcopy(tomllib.loads(EXAMPLE.read_text()))
    mutate(doc)
    with pytest.raises(ConfigError) as info:
        parse_config(doc, tmp_path)
    assert fragment in str(info.value)


def test_a_switch_may_serve_p4runtime_on_a_unix_socket(tmp_path):
    """testnet and make run reach the switch's P4Runtime through a Unix socket (its switch
    runs in a namespace of its own: homagg/lab/switch_process.py)."""
    doc = tomllib.loads(EXAMPLE.read_text())
    doc["switch"][0]["address"] = "unix:/tmp/homagg-p4runtime/s1.sock"
    assert parse_config(doc, tmp_path).switches[0].address == "unix:/tmp/homagg-p4runtime/s1.sock"


def test_two_switches_need_distinct_names_and_addresses(tmp_path):
    doc = tomllib.loads(EXAMPLE.read_text())
    doc["switch"].append(copy.deepcopy(doc["switch"][0]))
    with pytest.raises(ConfigError, match="two switches have name 's1'"):
        parse_config(doc, tmp_path)
    doc["switch"][1]["name"] = "s2"
    with pytest.raises(ConfigError, match="two switches have address"):
        parse_config(doc, tmp_path)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_a_switch_may_name_its_own_program(tmp_path):
    doc = tomllib.loads(EXAMPLE.read_text())
    (tmp_path / "tna").mkdir()
    (tmp_path / "tna" / "p4info.txtpb").write_text("")
    (tmp_path / "tna" / "device_config.pb").write_bytes(b"")
    [sw] = parse_config(doc, tmp_path).switches
    assert sw.p4info is None and sw.device_config is None  # the committed v1model build
    assert sw.lane_ops  # which adds 16- and 8-bit lanes
    doc["switch"][0].update(
        p4info="tna/p4info.txtpb", device_config="tna/device_config.pb", cells_per_packet=64
    )
    [sw] = parse_config(doc, tmp_path).switches
    assert sw.p4info == tmp_path / "tna" / "p4info.txtpb"
    assert sw.device_config == tmp_path / "tna" / "device_config.pb"
    assert not sw.lane_ops  # the TNA program drops ADD16 / ADD8 (docs/tofino.md)
    del doc["switch"][0]["device_config"]
    with pytest.raises(ConfigError, match="both p4info and device_config"):
        parse_config(doc, tmp_path)
    doc["switch"][0]["device_config"] = "tna/missing.pb"
    with pytest.raises(ConfigError, match=r"switch\[0\]\.device_config: .* is not a file"):
        parse_config(doc, tmp_path)


def test_cells_per_packet_is_the_switchs(tmp_path):
    """Each switch's program has its own cells per packet: the committed build's by default,
    required (and checked) for a switch that names its own program."""
    doc = tomllib.loads(EXAMPLE.read_text())
    (tmp_path / "p4info.txtpb").write_text("")
    (tmp_path / "device_config.pb").write_bytes(b"")
    tofino = dict(doc["switch"][0], name="tofino", address="10.9.9.9:9559")
    tofino.update(p4info="p4info.txtpb", device_config="device_config.pb")
    doc["switch"].append(tofino)
    with pytest.raises(ConfigError, match=r"switch\[1\]: .* needs cells_per_packet"):
        parse_config(doc, tmp_path)
    tofino["cells_per_packet"] = 64
    bmv2, tna = parse_config(doc, tmp_path).switches
    assert (bmv2.cells_per_packet, tna.cells_per_packet) == (CELLS_PER_PKT, 64)
    for bad in (100, 0, 512, "64"):
        tofino["cells_per_packet"] = bad
        with pytest.raises(ConfigError, match=r"switch\[1\]\.cells_per_packet"):
            parse_config(doc, tmp_path)
