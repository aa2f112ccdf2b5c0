"""homagg/lab/processes.py: outputs and exit codes in order; nothing left running on timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from homagg.lab.processes import run_together


def test_outputs_and_codes_in_command_order():
    py = sys.executable
    got = run_together(
        [[py, "-c", "import sys; print('a'); sys.exit(3)"], [py, "-c", "print('b')"]], 30
    )
    assert got == [(3, "a\n"), (0, "b\n")]


def test_a_hung_process_is_killed_and_the_timeout_propagates(tmp_path):
    marker = tmp_path / "pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_together([[sys.executable, "-c", code]], 1.5)
    assert time.monotonic() - start < 20
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
