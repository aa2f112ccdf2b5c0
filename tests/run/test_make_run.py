"""End to end: a shortened `make run` (2 hosts, refswitch, a small model, 40 steps) in
Mininet: the loss fell, every bucket went through the switch, the final parameters equal
gloo's within the fixed-point bound, and nothing was left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from homagg.lab.namespace import have_privileges

ROOT = Path(__file__).resolve().parents[2]


def _mininet_reason() -> str:
    if not have_privileges():
        return "needs root and iproute2 (Mininet, network namespaces)"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "Debian's mininet is not installed (make run-deps installs it)"
    if subprocess.run(["which", "mnexec"], capture_output=True).returncode != 0:
        return "mnexec (from the mininet package) is not on PATH"
    return ""


def python_m_run(args: list[str], timeout: float) -> str:
    """`python -m run ARGS` from the repository (as `make run` starts it); its standard
    output, after asserting that it exited 0 within `timeout` seconds."""
    done = subprocess.run(
        [sys.executable, "-m", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


pytestmark = pytest.mark.skipif(
    bool(_mininet_reason()), reason=_mininet_reason() or "runs make run in Mininet"
)


def _cmdlines_mentioning(text: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d.name}: {cmd}")
    return found


@pytest.mark.timeout(240)
def test_shortened_make_run_trains_exactly_and_cleans_up(tmp_path):
    from run.names import RunNames
    from run.state import our_links

    out = tmp_path / "out"
    stdout = python_m_run(
        [
            "--hosts",
            "2",
            "--target",
            "refswitch",
            "--steps",
            "40",
            "--users",
            "2000",
            "--items",
            "500",
            "--lr",
            "2",
            "--out",
            str(out),
        ],
        200,
    )
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
    names = RunNames(int(re.search(r"make run: run (\d+)", stdout).group(1)))
    assert our_links(names) == []
    assert not names.state_file.exists()
    assert not names.credentials_dir.exists()  # the run's secrets go with it
    assert _cmdlines_mentioning(str(out)) == []
    assert "on switch target refswitch (the reference switch" in stdout.splitlines()[0]
    # the hosts resolve each other's addresses (c10d logs a warning per failed lookup), and
    # a normal shutdown ends the switch's log without a traceback
    for log in out.glob("*-rank*.log"):
        assert "hostname of the client socket" not in log.read_text(), log
    assert "Traceback" not in (out / "switch.log").read_text()


@pytest.mark.timeout(200)
def test_dense_model_trains_exactly_through_the_switch(tmp_path):
    out = tmp_path / "out"
    stdout = python_m_run(
        [
            "--hosts",
            "2",
            "--target",
            "refswitch",
            "--model",
            "mlp",
            "--steps",
            "15",
            "--out",
            str(out),
        ],
        170,
    )
    assert "model mlp" in stdout and "AGREE within the bound" in stdout, stdout[-2000:]
    steps = [json.loads(line) for line in (out / "switch.jsonl").read_text().splitlines()]
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert all(s["fallback_buckets"] == 0 for s in steps)
    # dense gradients: the lossless codec sends about the dense size (bitmap + every value)
    assert all(1.0 <= s["agg_wire"] / s["agg_dense"] < 1.3 for s in steps[1:])
    # the transport's time split of the hook's switch time (run/train.py's records)
    for s in steps:
        split = s["encode_seconds"] + s["wait_seconds"] + s["decode_seconds"]
        assert s["wait_seconds"] > 0 and split <= s["switch_seconds"] + 1e-6, s


@pytest.mark.timeout(200)
def test_your_own_script_runs_through_the_switch(tmp_path):
    """`make run SCRIPT=examples/train_ddp.py`: the example, unchanged, attaches in the lab
    and every bucket goes through the switch (the gloo run is the same script with
    HOMAGG_ATTACH=0: its set-up is unit-tested, tests/run/test_script.py)."""
    out = tmp_path / "out"
    example = ROOT / "examples" / "train_ddp.py"
    script = ["--script", str(example), "--script-args", "--steps 6 --save model.pt"]
    stdout = python_m_run(
        ["--hosts", "2", "--target", "refswitch", "--no-gloo", "--out", str(out), *script], 170
    )
    assert f"script {example} --steps 6" in stdout.splitlines()[0]
    assert "[switch] step 5 loss" in stdout and "WALL s" in stdout, stdout[-2000:]
    assert re.search(r"CONTRIBUTION\s+\d+", stdout), stdout[-2000:]
    stats = json.loads((out / "switch" / "model.pt.json").read_text())
    assert stats["switch_buckets"] > 0 and stats["fallbacks"] == 0, stats
    assert (out / "make-run.png").stat().st_size > 10_000
