"""The TNA program's committed build (p4src/tofino/build/, docs/tofino.md): its P4Info holds
every entity the controller writes or reads, under the v1model program's names and with
widths its values fit, its ports are translated for Stratum, the resource summary says the
program fits Tofino 1, and homagg/control/tofino_pipeline.py packs the compiler's output in
the layout the build records. Whenever bf-p4c is on PATH, a fresh compile must give the
committed P4Info, summary and layout (skipped otherwise: the committed build is used as
it is)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format

from homagg.control.aggregation import JobEntries, Uplink, Worker
from homagg.control.entries import EntrySpec
from homagg.control.forwarding import Host, PeerService, forwarding_entries
from homagg.control.install import job_specs
from homagg.control.tofino_pipeline import PipelineConfig, from_compiler_output
from homagg.control.write_batch import WriteBatch
from homagg.p4rt.api import p4info_pb2
from homagg.p4rt.entities import TableEntry
from homagg.p4rt.p4info import P4InfoIndex
from homagg.wire import p4names
from homagg.wire.constants import MAX_JOB_ID, MAX_SWITCH_PORT, MAX_WORKERS_PER_JOB, NUM_SLOTS

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "p4src" / "tofino" / "build"
P4INFO = BUILD / "homagg_tna.p4info.txtpb"
RESOURCES = BUILD / "resources.txt"
LAYOUT = BUILD / "device_files.txt"  # the output files tofino_pipeline packs, one a line
SOURCES = BUILD / "sources.txt"  # what the build was made from (p4src/tofino/sources.py)
V1MODEL_P4INFO = REPO / "p4src" / "build" / "homagg.p4info.txtpb"
STALE = "is stale: run `make p4-tofino p4-tofino2` and commit p4src/tofino/build"
# The committed builds: target -> (build directory, the chip's stages, its stateful ALUs).
CHIPS = {"tofino": (BUILD, 12, 48), "tofino2": (BUILD / "tofino2", 20, 80)}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "p4src" / "tofino" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sources = _load("sources")


def test_the_stamp_sees_what_the_tna_program_sees(tmp_path):
    """A shared header's `#ifndef HOMAGG_TNA` block (nested conditionals included) is the
    v1model program's: changing it keeps the stamp; a change outside it does not."""
    head = "const bit<8> A = 1;\n"
    block = "#ifndef HOMAGG_TNA\n#if X\nconst bit<8> B = {};\n#endif\n#endif  /* HOMAGG_TNA */\n"
    texts = {}
    for name, body in {
        "v1": head + block.format(1),
        "v2": head + block.format(2),
        "out": "const bit<8> A = 2;\n" + block.format(1),
    }.items():
        path = tmp_path / f"{name}.p4"
        path.write_text(body + "const bit<8> C = 3;\n")
        texts[name] = sources.tna_text(path)
    assert texts["v1"] == texts["v2"] == (head + "const bit<8> C = 3;\n").encode()
    assert texts["out"] != texts["v1"]


@pytest.mark.parametrize("chip", CHIPS)
def test_the_committed_build_was_made_from_these_sources(chip):
    """Stale at once when a P4 source changed since the build (no compiler needed); when
    bf-p4c is on PATH, also when it is another compiler version than the build's."""
    stamp_file = CHIPS[chip][0] / SOURCES.name
    lines = stamp_file.read_text().splitlines()
    target = lines[0].removeprefix("target: ")
    cells = int(lines[1].removeprefix("TNA_CELLS: "))
    compiler = lines[2].removeprefix("compiler: ")
    assert (target, cells) == (chip, 64)
    assert sources.stamp(target, cells, compiler) == lines, f"{stamp_file} {STALE}"
    if shutil.which("bf-p4c"):
        version = subprocess.run(["bf-p4c", "--version"], capture_output=True, text=True)
        assert version.stdout.splitlines()[0].strip() == compiler, f"{stamp_file} {STALE}"


def load_p4info(path: Path = P4INFO) -> p4info_pb2.P4Info:
    return text_format.Parse(path.read_text(), p4info_pb2.P4Info())


# The direct counters the controller reads through job_table and worker_table.
V1MODEL_DIRECT_COUNTERS = {c.preamble.name for c in load_p4info(V1MODEL_P4INFO).direct_counters}


@pytest.mark.parametrize("chip", CHIPS)
def test_the_controllers_names_are_the_tna_p4infos(chip):
    """Exact names, not just dotted suffixes: what the controller reads back from the switch
    decodes to the names it wrote, so a reconciliation finds its own entries."""
    p4info = load_p4info(CHIPS[chip][0] / P4INFO.name)
    kinds = {
        "table": {t.preamble.name for t in p4info.tables},
        "action": {a.preamble.name for a in p4info.actions},
        "counter": {c.preamble.name for c in p4info.counters},
        "direct counter": {c.preamble.name for c in p4info.direct_counters},
    }
    names = set().union(*kinds.values())
    used = {v for k, v in vars(p4names).items() if k.isupper() and isinstance(v, str)}
    assert used <= names, used - names  # two-level aggregation and service sources included
    assert set(p4names.TABLES) <= kinds["table"]
    assert set(p4names.COUNTERS) <= kinds["counter"]
    assert V1MODEL_DIRECT_COUNTERS
    assert V1MODEL_DIRECT_COUNTERS.issubset(kinds["direct counter"])


def _largest_job() -> JobEntries:
    """A job at the top of every range the controller writes, at a leaf of a tree."""
    workers = tuple(
        Worker(
            rank=r,
            switch_port=MAX_SWITCH_PORT - r,
            mac="02:ff:ff:ff:ff:fe",
            ip="10.255.255.253",
            udp_port=65535,
        )
        for r in range(MAX_WORKERS_PER_JOB)
    )
    job = JobEntries(
        job_id=MAX_JOB_ID,
        pool_base=NUM_SLOTS - 1,
        pool_size=1,
        mcast_grp=MAX_JOB_ID,
        workers=workers,
        uplink=Uplink(
            MAX_SWITCH_PORT, MAX_WORKERS_PER_JOB - 1, "10.255.255.254", "02:ff:ff:ff:ff:ff"
        ),
    )
    job.validate()
    return job


@pytest.mark.parametrize("chip", CHIPS)
def test_every_entry_the_controller_writes_encodes_and_reads_back(chip):
    index = P4InfoIndex.from_text_file(CHIPS[chip][0] / P4INFO.name)
    hosts = [Host("10.0.0.1", "02:00:00:00:01:01", 1), Host("10.0.0.2", "02:00:00:00:01:02", 509)]
    specs = [
        *(s for s in job_specs(_largest_job()) if isinstance(s, EntrySpec)),
        *forwarding_entries(
            hosts, "10.0.0.254", "02:00:00:00:00:fe", peers=[PeerService("10.0.1.254", 509)]
        ),
    ]
    assert {s.table for s in specs} == {*p4names.TABLES, *p4names.TREE_TABLES}
    for spec in specs:
        [update] = spec.insert(WriteBatch(index))
        assert EntrySpec.read(TableEntry.from_proto(update.entity.table_entry, index)) == spec
    v1model = P4InfoIndex.from_text_file(V1MODEL_P4INFO)
    for table in p4names.TABLES:
        v1_direct = v1model.table_direct_counter(table)
        direct = index.table_direct_counter(table)
        assert (direct and direct.name) == (v1_direct and v1_direct.name), table
    for name, cells in (
        (p4names.INGRESS_DROPS, 16),
        (p4names.EGRESS_DROPS, 16),
        (p4names.EVENT_COUNTER, 4),
    ):
        assert index.counter(name).size == cells


@pytest.mark.parametrize("chip", CHIPS)
def test_ports_are_translated_for_stratum(chip):
    """Behind Stratum, P4Runtime carries SDN port numbers (as in multicast replicas); the
    switch translates every value of the `tna/PortId_t` type to its own."""
    p4info = load_p4info(CHIPS[chip][0] / P4INFO.name)
    translated = p4info.type_info.new_types["sdn_port_t"].translated_type
    assert (translated.uri, translated.sdn_bitwidth) == ("tna/PortId_t", 32)
    index = P4InfoIndex(p4info)
    for action in (p4names.ROUTE, p4names.SET_WORKER, p4names.SET_UPLINK, p4names.PEER_SERVICE):
        params = next(a for a in p4info.actions if a.preamble.name == action).params
        param = next(p for p in params if p.name == "port")
        assert (param.type_name.name, param.bitwidth) == ("sdn_port_t", 32)
        assert index.action(action).param("port").bitwidth == 32


@pytest.mark.parametrize("chip", CHIPS)
def test_the_summary_says_the_program_fits_the_chip(chip):
    build, stages, stateful_alus = CHIPS[chip]
    text = (build / RESOURCES.name).read_text()
    assert re.search(rf"^target: {chip}$", text, re.M), text[:200]
    used, total = map(int, re.search(r"^MAU stages used: (\d+) of (\d+)$", text, re.M).groups())
    assert total == stages and 1 <= used <= total
    alus = re.search(r"^\| all \(of the chip\) \|(.*)\|$", text, re.M).group(1).split("|")
    stateful = alus[3].strip()  # SRAM, map RAM, TCAM, stateful ALU, ...
    # 32 cell pairs (64 cells) and the four registers of the slot state.
    assert stateful == f"36 of {stateful_alus}", stateful


def _fake_output(root: Path, files: list[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    return root


@pytest.mark.parametrize("chip", CHIPS)
def test_the_recorded_output_layout_packs(chip, tmp_path):
    """The files bf-p4c writes (as the build records them) are what tofino_pipeline packs:
    bfrt.json and, per pipe, context.json and the binary."""
    files = (CHIPS[chip][0] / LAYOUT.name).read_text().split()
    cfg = from_compiler_output(_fake_output(tmp_path / "out", files))
    pipes = sorted(Path(f).parent.as_posix() for f in files if f.endswith("/context.json"))
    assert pipes and [p.name for p in cfg.profiles] == pipes
    assert cfg.bfruntime_info == b"bfrt.json"
    for p in cfg.profiles:
        assert p.context == f"{p.name}/context.json".encode()
        assert re.fullmatch(rf"{p.name}/tofino\d?\.bin", p.binary.decode())
    assert PipelineConfig.unpack(cfg.pack()) == cfg


@pytest.mark.skipif(
    shutil.which("bf-p4c") is None,
    reason="bf-p4c (p4c's Tofino back end) is not on PATH: the committed build is used as it is",
)
@pytest.mark.timeout(3600)
def test_the_committed_build_is_a_fresh_compile(tmp_path):
    """About 80 s of one core's compiling: the committed P4Info, summary, stamp and layout
    are what bf-p4c makes of the sources now."""
    out = tmp_path / "build"
    subprocess.run(
        ["make", "--no-print-directory", "p4-tofino", f"TOFINO_BUILD={out}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=3600,
    )
    for name in (P4INFO.name, RESOURCES.name, SOURCES.name):
        assert (out / name).read_text() == (BUILD / name).read_text(), f"{name} {STALE}"
    layout = sorted(
        p.relative_to(out / "out").as_posix()
        for p in (out / "out").rglob("*")
        if p.name in ("bfrt.json", "context.json") or re.fullmatch(r"tofino\d?\.bin", p.name)
    )
    assert layout == LAYOUT.read_text().split(), f"{LAYOUT.name} {STALE}"
    packed = PipelineConfig.unpack((out / "out" / "device_config.pb").read_bytes())
    assert packed == from_compiler_output(out / "out")
    assert b"job_table" in packed.bfruntime_info and packed.profiles[0].binary
