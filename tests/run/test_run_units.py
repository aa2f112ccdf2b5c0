"""The pieces of `make run` that need neither root nor Mininet: the topology file, the
report (table, bound, plot), the run state that `make stop` reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from run import report
from run.state import RunState, alive, cleanup

ROOT = Path(__file__).resolve().parents[2]


def test_topology_file_and_overrides():
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from run.net import Topology

    t = Topology.load(ROOT / "mininet" / "star4.toml")
    assert (t.hosts, t.bw_mbit) == (4, 100.0)
    assert Topology.load(ROOT / "mininet" / "star4.toml", hosts=2, bw_mbit=None).hosts == 2


def _steps(n: int) -> list[dict]:
    return [
        {
            "step": i,
            "loss": 0.7 - 0.01 * i,
            "seconds": 0.1,
            "tx_bytes": 100.0,
            "dense_bytes": 1000,
            "retransmissions": 1,
            "fallback_buckets": 0,
            "grad_max": 0.01,
            "param_max": 1.0,
        }
        for i in range(n)
    ]


def test_summary_bound_and_plot(tmp_path):
    table = report.summary_table({"switch": _steps(5), "gloo": _steps(5)})
    assert "0.10x" in table and table.splitlines()[1].startswith("switch")
    # W = 2: P = 30; E(0.01) = -6: lr * (2^-37 + 2^-30) + 2^-23 (param 1.0 -> E = 1) per step
    one = 0.5 * (2.0**-37 + 2.0**-30) + 2.0**-23
    assert report.fixed_point_bound(_steps(3), 2, 0.5) == pytest.approx(3 * one)
    report.plot({"a": _steps(5)}, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    torch.save({"w": torch.ones(3)}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(3) + 1e-6}, tmp_path / "b.pt")
    assert report.compare(tmp_path / "a.pt", tmp_path / "b.pt") == pytest.approx(1e-6, rel=0.2)


def test_stop_refuses_while_the_run_lives_and_forgets_a_dead_one(tmp_path, monkeypatch):
    monkeypatch.setattr("run.state.our_links", lambda: [])
    path = tmp_path / "state.json"
    RunState(path).add("pgids", 2**22 + 12345)  # a PID that does not exist
    with pytest.raises(RuntimeError, match="still running"):
        cleanup(path)  # its owner (this process) is alive
    data = json.loads(path.read_text())
    data["owner"] = [2**22 + 1]
    path.write_text(json.dumps(data))
    assert cleanup(path) == [] and not path.exists()
    assert alive(os.getpid()) and not alive(2**22 + 1)
