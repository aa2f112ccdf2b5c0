"""A run that fails does not sink a benchmark: run_once raises RunFailed (a failing exit
status, or step records missing), the benchmark notes it and goes on, the report leaves
its rows out and lists it under the tables; an interrupted run (Ctrl-C) stops it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import peers, publish
from bench.runs import RunFailed, RunSpec, note_failure, run_once


class FakeRun:
    """A `python -m run` that writes the given record files and exits with `code`."""

    def __init__(self, out: Path, code: int, files: list[str], stdout: str = "") -> None:
        self.out, self.code, self.files, self.stdout = out, code, files, stdout
        self.returncode: int | None = None

    def __call__(self, cmd: list[str], **_: object) -> FakeRun:
        self.out.mkdir(parents=True, exist_ok=True)
        for f in self.files:
            (self.out / f).write_text('{"loss": 1.0, "seconds": 0.1}\n')
        return self

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        self.returncode = self.code
        return self.stdout, None


def _spec() -> RunSpec:
    return RunSpec("mlp", "lossless", 4, 0.0, 3, True, [], "refswitch")


@pytest.mark.parametrize(
    ("code", "files", "why"),
    [
        (3, [], "exit 3"),  # the run failed, said so
        (1, ["switch.jsonl"], "no gloo.jsonl"),  # status 1 but a job left no records
        (0, ["gloo.jsonl"], "no switch.jsonl"),
    ],
)
def test_run_once_raises_run_failed_with_the_reason(tmp_path, monkeypatch, code, files, why):
    out = tmp_path / "out"
    fake = FakeRun(
        out,
        code,
        files,
        "make run: run 1 on switch target bmv2 (BMv2), 4 hosts, model mlp\n"
        "make run failed: job timed out\n",
    )
    monkeypatch.setattr(subprocess, "Popen", fake)
    with pytest.raises(RunFailed, match=why) as got:
        run_once(_spec(), out)
    assert "job timed out" in str(got.value)


def test_run_once_takes_status_1_with_every_record_as_a_timed_run(tmp_path, monkeypatch):
    out = tmp_path / "out"  # 1: the parameters differ beyond the bound, still measured
    monkeypatch.setattr(subprocess, "Popen", FakeRun(out, 1, ["switch.jsonl", "gloo.jsonl"]))
    got, target = run_once(_spec(), out)
    assert set(got) == {"switch, lossless", "DDP over gloo"} and target == "refswitch"


def test_run_once_reads_the_target_that_ran_from_the_first_line(tmp_path, monkeypatch):
    out = tmp_path / "out"
    line = "make run: run 2 on switch target ebpf (the P4 program as an eBPF program), 4 hosts\n"
    monkeypatch.setattr(subprocess, "Popen", FakeRun(out, 0, ["switch.jsonl", "gloo.jsonl"], line))
    assert run_once(_spec(), out)[1] == "ebpf"


def test_an_interrupted_run_stops_the_benchmark(tmp_path, monkeypatch):
    out = tmp_path / "out"  # 130: Ctrl-C reached the run; no next run starts
    monkeypatch.setattr(subprocess, "Popen", FakeRun(out, 130, []))
    with pytest.raises(KeyboardInterrupt, match="was interrupted"):
        run_once(_spec(), out)


def test_failures_are_listed_under_the_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "RESULTS", tmp_path)
    failed: list[str] = []
    note_failure(failed, "lm, round 2, switch, lowbit8", RunFailed("exit 3 (job timed out)"))
    publish.publish("x", ["| a |"], "s", failed)
    text = (tmp_path / "x.md").read_text()
    assert text.endswith("- lm, round 2, switch, lowbit8: exit 3 (job timed out)\n")


def test_the_peer_report_leaves_out_a_method_whose_runs_all_failed():
    tally = peers.Tally()
    steps = [
        {"loss": 1.0 - 0.1 * i, "seconds": 0.1, "tx_bytes": 1, "dense_bytes": 2} for i in range(8)
    ]
    got = {"DDP over gloo": steps, "switch, lossless": steps}  # fixed point failed
    tally.add("ncf", got, peers.target_of(steps))
    assert peers.present("ncf", tally) == ["DDP over gloo", "switch, lossless"]
    table = "\n".join(peers.table(["ncf"], tally))
    assert "fixed_point" not in table and "| switch, lossless |" in table
    lone = peers.Tally()
    lone.add("mlp", {"switch, lossless": steps}, 0.5)  # no gloo: nothing to compare with
    assert peers.present("mlp", lone) == [] and len(peers.table(["mlp"], lone)) == 2
    assert "no comparison" in peers.summary_of(["mlp"], lone)
