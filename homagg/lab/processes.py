"""Several processes started together and waited for with a bound, for tests that run ranks
or whole runs side by side and must never leave one behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_together(
    cmds: Sequence[Sequence[str]],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stop: signal.Signals = signal.SIGKILL,
    grace: float = 5.0,
) -> list[tuple[int, str]]:
    """Start every command at once and wait for all of them (each within `timeout` s);
    returns (exit code, output with stderr) per command. One still running at the end (a
    timeout, an interrupt) gets `stop` (a run that tears its network down wants SIGTERM),
    then SIGKILL after `grace` s, and subprocess.TimeoutExpired propagates."""
    procs = [
        subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=dict(env) if env is not None else dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cmd in cmds
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(stop)
                try:
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(grace)
    return [(p.returncode, out) for p, out in zip(procs, outputs)]
