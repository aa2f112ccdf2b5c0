"""Shortened `make run`s in Mininet for the tests of tests/run: whether they can run here,
and a group of runs started at once (each run's names, addresses and directories
are its own: run/names.py), which several tests then check (conftest.py's fixtures)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from homagg.lab.namespace import have_privileges
from homagg.lab.processes import run_together

ROOT = Path(__file__).resolve().parents[2]
# A group of runs on 2 cores: each run's own bound, and a little more for the group.
GROUP_TIMEOUT = 360
TWO_HOSTS = ["--hosts", "2", "--target", "refswitch"]
# the dense MLP's short run (its tests read the output and the JSON lines, not the plot)
MLP = [*TWO_HOSTS, "--model", "mlp", "--steps", "12", "--no-plot"]


def mininet_reason() -> str:
    """Why the Mininet tests cannot run here ("" when they can)."""
    if not have_privileges():
        return "needs root and iproute2 (Mininet, network namespaces)"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "Debian's mininet is not installed (make run-deps installs it)"
    if subprocess.run(["which", "mnexec"], capture_output=True).returncode != 0:
        return "mnexec (from the mininet package) is not on PATH"
    return ""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def cmdlines_mentioning(text: str) -> list[str]:
    """The command lines of this machine's processes (but this one) that contain `text`."""
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


def run_number(text: str) -> int | None:
    """The run number a run's output names (None: it never claimed one)."""
    found = re.search(r"make run: run (\d+)", text)
    return int(found.group(1)) if found else None


def leftovers(text: str, out: Path) -> list[str]:
    """What a finished run left behind: its interfaces, its state file, its credentials,
    processes started with its output directory. Looked at as soon as it ends: a later run
    may take its number (and names) again."""
    from run.names import RunNames
    from run.state import our_links

    number = run_number(text)
    left = [f"process {c}" for c in cmdlines_mentioning(str(out))]
    if number is not None:
        names = RunNames(number)
        left += [f"interface {x}" for x in our_links(names)]
        left += [f"state file {names.state_file}"] if names.state_file.exists() else []
        left += [f"credentials {names.credentials_dir}"] if names.credentials_dir.exists() else []
    return left


@dataclass(frozen=True)
class Run:
    """One finished `python -m run`: its exit code, its output (stderr included), its
    output directory, and what it left behind when it ended (leftovers)."""

    code: int
    text: str
    out: Path
    left: tuple[str, ...]

    def output(self) -> str:
        """The output, after asserting that the run exited 0."""
        assert self.code == 0, self.text[-3000:]
        return self.text


def runs_together(runs: dict[str, list[str]], base: Path) -> dict[str, Run]:
    """`python -m run ARGS --out base/NAME` for every NAME: ARGS of `runs`, all started at
    once and waited for within GROUP_TIMEOUT s (SIGTERM to a late one: a run tears its
    network down itself)."""
    outs = {name: base / name for name in runs}
    cmds = [
        [sys.executable, "-m", "run", *args, "--out", str(outs[name])]
        for name, args in runs.items()
    ]
    done = run_together(cmds, GROUP_TIMEOUT, env=_env(), cwd=ROOT, stop=signal.SIGTERM, grace=60)
    return {
        name: Run(code, text, outs[name], tuple(leftovers(text, outs[name])))
        for name, (code, text) in zip(runs, done)
    }
