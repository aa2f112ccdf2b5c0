"""Two shortened `make run` at once (2 hosts, refswitch, 3 steps each) both finish: every
name, address and directory is per run (run/names.py), and each cleans up only its own."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
from test_make_run import _mininet_reason  # tests/run is on sys.path (rootdir-less)

from homagg.lab.processes import run_together

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    bool(_mininet_reason()), reason=_mininet_reason() or "runs make run in Mininet"
)


@pytest.mark.timeout(180)
def test_two_runs_at_once_both_finish_and_clean_up(tmp_path):
    from run.names import RunNames
    from run.state import our_links

    cmd = [sys.executable, "-m", "run", "--hosts", "2", "--target", "refswitch", "--steps", "3"]
    cmd += ["--users", "500", "--items", "200", "--no-gloo", "--timeout", "120"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_together(
        [[*cmd, "--out", str(tmp_path / f"out{i}")] for i in range(2)],
        170,
        env=env,
        cwd=ROOT,
        stop=signal.SIGTERM,  # the run stops everything it started itself
        grace=60,
    )
    outputs = [out for _, out in done]
    for code, out in done:
        assert code == 0, out[-3000:]
        assert "[switch] step    3/3" in out, out[-2000:]
    numbers = [int(re.search(r"make run: run (\d+)", out).group(1)) for out in outputs]
    assert numbers[0] != numbers[1]
    for n in numbers:
        assert our_links(RunNames(n)) == [] and not RunNames(n).state_file.exists()
