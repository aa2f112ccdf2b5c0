"""End to end: shortened `make run`s in Mininet (2 hosts on the reference switch, and
TOPO=two-level's 8), started together
(conftest.py's training_runs): NCF for 40 steps (the loss fell, every bucket went through the
switch, the final parameters equal gloo's within the fixed-point bound, nothing was left
behind), make run TOPO=two-level with the dense MLP (8 hosts on two leaves under a spine:
both levels' counters, gloo's parameters within the bound, the lossless codec's wire size,
the transport's time split), and examples/train_ddp.py as make run's --script (switch run
only)."""

from __future__ import annotations

import json
import re

import pytest
from mininet_runs import ROOT, TREE_STEPS, mininet_reason, run_number

from run.names import RunNames

pytestmark = pytest.mark.skipif(
    bool(mininet_reason()), reason=mininet_reason() or "runs make run in Mininet"
)


@pytest.mark.timeout(420)
def test_shortened_make_run_trains_exactly_and_cleans_up(training_runs):
    run = training_runs["ncf"]
    out, stdout = run.out, run.output()
    assert "first-order fixed-point bound" in stdout, stdout[-2000:]
    assert "AGREE within the bound" in stdout, stdout[-2000:]
    assert "[switch] step   40/40" in stdout and "[gloo  ] step   40/40" in stdout
    assert (out / "make-run.png").stat().st_size > 10_000
    steps = [json.loads(line) for line in (out / "switch.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses
    assert all(s["fallback_buckets"] == 0 for s in steps)  # every bucket was summed by the switch
    assert all(s["tx_bytes"] < s["dense_bytes"] for s in steps[1:])
    # nothing left: interfaces, the state file, processes started with our output directory
    assert run_number(stdout) is not None and run.left == ()
    assert "on switch target refswitch (the reference switch" in stdout.splitlines()[0]
    # the hosts resolve each other's addresses (c10d logs a warning per failed lookup), and
    # a normal shutdown ends the switch's log without a traceback
    for log in out.glob("*-rank*.log"):
        assert "hostname of the client socket" not in log.read_text(), log
    assert "Traceback" not in (out / "switch.log").read_text()


def counters(text: str) -> dict[str, dict[str, int]]:
    """The summary's switch counters (aggctl counters): per switch name, its EVENT rows."""
    found: dict[str, dict[str, int]] = {}
    events: dict[str, int] = {}
    for line in text.split("switch counters (aggctl counters)", 1)[-1].splitlines():
        words = line.split()
        if line.startswith("switch "):
            events = found.setdefault(words[1], {})
        elif len(words) == 2 and words[0].isupper() and words[1].isdigit():
            events[words[0]] = int(words[1])
    return found


@pytest.mark.timeout(420)
def test_two_level_tree_trains_the_dense_model_exactly(training_runs):
    """make run TOPO=two-level (8 hosts, 2 leaves x 4 under a spine) with the dense MLP:
    every chunk summed at both levels (each leaf's 4 contributions and its partial, the
    spine's 2 partials), the parameters gloo's within the fixed-point bound, nothing left."""
    run = training_runs["tree"]
    out, stdout = run.out, run.output()
    first = stdout.splitlines()[0]
    assert "8 hosts, model mlp" in first, first
    assert "AGREE within the bound" in stdout, stdout[-2000:]
    assert f"[switch] step {TREE_STEPS:4d}/{TREE_STEPS}" in stdout, stdout[-2000:]
    number = run_number(stdout)
    assert number is not None
    names = RunNames(number)
    got = counters(stdout)
    spine, leaves = got[names.switch], [got[names.leaf(k)] for k in range(2)]
    chunks = spine["RESULT"]  # the spine: one partial from each leaf a chunk, no partial
    assert chunks > 0 and spine["CONTRIBUTION"] == 2 * chunks and "PARTIAL" not in spine, got
    for leaf in leaves:  # re-sent partials count as PARTIAL again: at least one a chunk
        assert (leaf["CONTRIBUTION"], leaf["RESULT"]) == (4 * chunks, chunks), got
        assert leaf["PARTIAL"] >= chunks, got
    steps = [json.loads(line) for line in (out / "switch.jsonl").read_text().splitlines()]
    assert "plot: none (--no-plot)" in stdout and not (out / "make-run.png").exists()
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert all(s["fallback_buckets"] == 0 for s in steps)
    # dense gradients: the lossless codec sends about the dense size (bitmap + every value)
    assert all(1.0 <= s["agg_wire"] / s["agg_dense"] < 1.3 for s in steps[1:])
    # the transport's time split of the hook's switch time (run/train.py's records)
    for s in steps:
        split = s["encode_seconds"] + s["wait_seconds"] + s["decode_seconds"]
        assert s["wait_seconds"] > 0 and split <= s["switch_seconds"] + 1e-6, s
    # each switch a process with its own log, ended normally; every switch's P4Runtime
    # socket, node shell and namespace went with the run
    for log in [out / "switch.log", *(out / f"switch-{names.leaf(k)}.log" for k in range(2))]:
        assert "Traceback" not in log.read_text(), log
    assert run.left == ()


@pytest.mark.timeout(420)
def test_your_own_script_runs_through_the_switch(training_runs):
    """`make run SCRIPT=examples/train_ddp.py`: the example, unchanged, attaches in the lab
    and every bucket goes through the switch (the gloo run is the same script with
    HOMAGG_ATTACH=0: its set-up is unit-tested, tests/run/test_script.py)."""
    run = training_runs["script"]
    out, stdout = run.out, run.output()
    example = ROOT / "examples" / "train_ddp.py"
    assert f"script {example} --steps 6" in stdout.splitlines()[0]
    assert "[switch] step 5 loss" in stdout and "WALL s" in stdout, stdout[-2000:]
    assert re.search(r"CONTRIBUTION\s+\d+", stdout), stdout[-2000:]
    stats = json.loads((out / "switch" / "model.pt.json").read_text())
    assert stats["switch_buckets"] > 0 and stats["fallbacks"] == 0, stats
    assert (out / "make-run.png").stat().st_size > 10_000
    assert run.left == ()
