"""p4src/tofino/resources.py: the summary of a bf-p4c compile is deterministic and counts
what the compiler's logs say, and a missing log is a clear error."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("resources", REPO / "p4src/tofino/resources.py")
assert _spec is not None and _spec.loader is not None
resources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resources)


def _stage(n: int, srams: int, alus: int) -> dict:
    """A stage as bf-p4c's resources.json has it: each block's capacity beside its list of
    used units (rows x columns, rows x units per row, or a count)."""
    use = [{"used_by": "t", "used_for": "match"}]
    return {
        "stage_number": n,
        "rams": {
            "nRows": 8,
            "nColumns": 10,
            "srams": [{"row": 0, "column": i, "usages": use} for i in range(srams)],
        },
        "map_rams": {
            "nRows": 8,
            "nUnits": 6,
            "maprams": [{"row": 0, "unit_id": 0, "usages": use}] * (srams // 2),
        },
        "gateways": {"nRows": 8, "nUnits": 2, "gateways": [{"row": 0, "unit_id": 0}] * alus},
        "tcams": {"nRows": 12, "nColumns": 2, "tcams": []},
        "meter_alus": {"nAlus": 4, "meters": [{"row": 1, "usages": use}] * alus},
        "statistic_alus": {"nAlus": 4, "stats": []},
        "hash_distribution_units": {"nHashIds": 2, "nUnitIds": 3, "units": [{}] * alus},
        "vliw": {"size": 32, "instructions": [{}] * (srams + alus)},
        "logical_tables": {"size": 16, "ids": [{"id": 0, "table_name": "t"}]} if srams else {},
    }


def _compile_output(tmp_path: Path) -> Path:
    logs = tmp_path / "out" / "pipe" / "logs"
    logs.mkdir(parents=True)
    res = {
        "program_name": "homagg_tna.p4",
        "run_id": "abc",
        "build_date": "today",
        "compiler_version": "9.13.0",
        "resources": {
            "mau": {
                "nStages": 12,
                "mau_stages": [_stage(1, 2, 4), _stage(0, 3, 1), _stage(2, 0, 0)],
            },
            "phv_containers": {
                "normal": [{"width": 8, "units": 64}, {"width": 32, "units": 64}],
                "tagalong": [{"width": 8, "units": 32}],
            },
            "parser": {
                "parsers": [
                    {"gress": "ingress", "parser_id": 0, "nStates": 256, "states": [{}] * 9},
                    {"gress": "egress", "parser_id": 0, "nStates": 256, "states": [{}] * 4},
                ]
            },
            "deparser": [{"gress": "ingress", "pov": {"size": 128, "pov_bits": [{}] * 7}}],
        },
    }
    (logs / "resources.json").write_text(json.dumps(res))
    slice8 = {"slice_info": {"lsb": 0, "msb": 7}}
    slice5 = {"slice_info": {"lsb": 0, "msb": 4}}
    phv = {
        "target": "tofino",
        "containers": [
            {
                "bit_width": 32,
                "container_type": "normal",
                "gress": "ingress",
                "slices": [slice8, slice5],
            },
            {"bit_width": 32, "container_type": "normal", "gress": "egress", "slices": [slice8]},
            {"bit_width": 8, "container_type": "normal", "gress": "ingress", "slices": [slice8]},
            {"bit_width": 8, "container_type": "tagalong", "gress": "egress", "slices": [slice5]},
        ],
    }
    (logs / "phv.json").write_text(json.dumps(phv))
    return tmp_path / "out"


def test_summary_counts_each_stage_against_its_capacity(tmp_path):
    text = "\n".join(resources.summarize(_compile_output(tmp_path)))
    assert "target: tofino" in text and "MAU stages used: 2 of 12" in text
    # stage | SRAM | map RAM | TCAM | stateful | stats | gateway | hash dist | VLIW | logical
    assert "| 0 | 3 | 1 | 0 | 1 | 0 | 1 | 1 | 4 | 1 |" in text  # sorted, empty stage left out
    assert "| 1 | 2 | 1 | 0 | 4 | 0 | 4 | 4 | 6 | 1 |" in text
    assert "| per stage | 80 | 48 | 24 | 4 | 4 | 16 | 6 | 32 | 16 |" in text
    assert (
        "| all (of the chip) | 5 of 960 | 2 of 576 | 0 of 288 | 5 of 48 | 0 of 48 | 5 of 192 |"
        in text
    )
    assert "today" not in text and "abc" not in text and str(tmp_path) not in text


def test_summary_counts_phv_per_thread_and_the_parsers(tmp_path):
    text = "\n".join(resources.summarize(_compile_output(tmp_path)))
    # kind width | ingress | egress | of containers | field bits | of bits
    assert "| normal 32-bit | 1 | 1 | 64 | 21 | 2048 |" in text
    assert "| normal 8-bit | 1 | 0 | 64 | 8 | 512 |" in text
    assert "| tagalong 8-bit | 0 | 1 | 32 | 5 | 256 |" in text
    assert "| ingress parser 0 | TCAM rows | 9 | 256 |" in text
    assert "| ingress deparser | POV bits | 7 | 128 |" in text


def test_missing_log_says_how_to_get_it(tmp_path):
    out = _compile_output(tmp_path)
    (out / "pipe" / "logs" / "phv.json").unlink()
    with pytest.raises(resources.SummaryError, match="-g"):
        resources.summarize(out)
    assert resources.main([str(out)]) == 1
    assert resources.main([]) == 2
