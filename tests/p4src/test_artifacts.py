"""The committed BMv2 JSON and P4Info are the program's: present, consistent with the
Python side, and identical to a fresh compile whenever p4c is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format

from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.p4rt.api import p4info_pb2
from homagg.refswitch.switch import check_program
from homagg.wire import p4names

REPO = Path(__file__).resolve().parents[2]


def load_p4info() -> p4info_pb2.P4Info:
    return text_format.Parse(P4INFO_PATH.read_text(), p4info_pb2.P4Info())


def test_artifacts_are_the_program_the_python_side_expects():
    check_program(load_p4info(), BMV2_JSON_PATH.read_bytes())


def test_a_program_with_tables_the_switch_models_lack_is_refused():
    """Their entries would be taken and do nothing (e.g. a leaf's uplink on a model without
    it would multicast each partial as the result): the reference and eBPF switches refuse."""
    p4info = load_p4info()
    extra = p4info.tables.add()
    extra.CopyFrom(p4info.tables[0])
    extra.preamble.name = "SwitchIngress.aggregation.spare"
    extra.preamble.id += 1000
    with pytest.raises(ValueError, match=r"does not implement .*spare"):
        check_program(p4info, BMV2_JSON_PATH.read_bytes())


def test_every_name_the_controller_uses_exists():
    p4info = load_p4info()
    names = {
        o.preamble.name
        for group in (p4info.tables, p4info.actions, p4info.counters, p4info.direct_counters)
        for o in group
    }
    used = {v for k, v in vars(p4names).items() if k.isupper() and isinstance(v, str)}
    assert used - names == set()


@pytest.mark.skipif(
    shutil.which("p4c") is None,
    reason="p4c is not installed: the committed artifacts are used as they are",
)
@pytest.mark.timeout(900)  # ~15 s of CPU, minutes of wall time on a loaded machine
def test_committed_artifacts_match_a_fresh_compile(tmp_path):
    out = tmp_path / "build"
    subprocess.run(
        ["make", "--no-print-directory", "-B", "p4", f"P4_BUILD={out}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )
    stale = "is stale: run `make p4` and commit it"
    fresh_json, committed_json = (
        json.loads(p.read_text()) for p in (out / BMV2_JSON_PATH.name, BMV2_JSON_PATH)
    )
    for doc in (fresh_json, committed_json):
        doc.pop("program")  # the path of p4c's preprocessed file in its output directory
    assert fresh_json == committed_json, f"{BMV2_JSON_PATH.relative_to(REPO)} {stale}"
    assert (out / P4INFO_PATH.name).read_text() == P4INFO_PATH.read_text(), (
        f"{P4INFO_PATH.relative_to(REPO)} {stale}"
    )
