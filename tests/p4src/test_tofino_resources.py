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
    use = [{"used_by": "t", "used_for": "match"}]
    return {
        "stage_number": n,
        "rams": {
            "nRows": 8,
            "nColumns": 10,
            "srams": [{"row": 0, "column": i, "usages": use} for i in range(srams)],
        },
        "meter_alus": {"nAlus": 4, "meters": [{"row": 1, "usages": use}] * alus},
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
            }
        },
    }
    (logs / "resources.json").write_text(json.dumps(res))
    slice8 = {"slice_info": {"lsb": 0, "msb": 7}}
    slice5 = {"slice_info": {"lsb": 0, "msb": 4}}
    phv = {
        "containers": [
            {"bit_width": 32, "slices": [slice8, slice5]},
            {"bit_width": 32, "slices": []},
            {"bit_width": 8, "slices": [slice8]},
        ]
    }
    (logs / "phv.json").write_text(json.dumps(phv))
    return tmp_path / "out"


def test_summary_counts_each_stage_and_the_phv(tmp_path):
    lines = resources.summarize(_compile_output(tmp_path))
    text = "\n".join(lines)
    assert "MAU stages used: 2 of 12" in text
    assert "| 0 | 3 | 0 | 0 | 1 | 0 | 0 | 1 |" in text  # stages sorted, empty stage left out
    assert "| 1 | 2 | 0 | 0 | 4 | 0 | 0 | 1 |" in text
    assert "| all (of the chip) | 5 of 960 |" in text and "5 of 48" in text  # 4 ALUs x 12
    assert "| 32-bit | 1 | 13 |" in text and "| 8-bit | 1 | 8 |" in text
    assert "today" not in text and "abc" not in text and str(tmp_path) not in text


def test_missing_log_says_how_to_get_it(tmp_path):
    out = _compile_output(tmp_path)
    (out / "pipe" / "logs" / "phv.json").unlink()
    with pytest.raises(resources.SummaryError, match="-g"):
        resources.summarize(out)
    assert resources.main([str(out)]) == 1
    assert resources.main([]) == 2
