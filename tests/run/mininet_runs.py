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
from typing import TYPE_CHECKING

from homagg.lab.namespace import have_privileges
from homagg.lab.processes import run_together

if TYPE_CHECKING:
    from run.names import RunNames

ROOT = Path(__file__).resolve().parents[2]
# A group of runs on 2 cores: each run's own bound, and a little more for the group.
GROUP_TIMEOUT = 360
TWO_HOSTS = ["--hosts", "2", "--target", "refswitch"]
# the dense MLP's short run (its tests read the output and the JSON lines, not the plot)
MLP = [*TWO_HOSTS, "--model", "mlp", "--steps", "12", "--no-plot"]
# make run TOPO=two-level's 8 hosts, the dense MLP for 8 steps, on the eBPF target where it
# loads (its switches cost the shared cores least), else the reference switch
TREE_STEPS = 8


def tree_run() -> list[str]:
    """The arguments of the shortened two-level run (the target chosen as it starts)."""
    from homagg.lab.switch_process import target_problem

    target = "refswitch" if target_problem("ebpf") else "ebpf"
    model = ["--model", "mlp", "--steps", str(TREE_STEPS), "--no-plot"]
    return ["--topo", "two-level", "--target", target, *model]


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


def mininet_shells(names: RunNames) -> list[str]:
    """Mininet's node shells of a run that are still alive (`bash ... -is mininet:NAME`,
    one per host and switch, each holding its node's namespaces), any node name it may use."""
    from homagg.lab.addresses import MAX_HOSTS_WITH_CONTROLLER
    from run.net import MAX_LEAVES

    nodes = [names.switch, names.controller_host]
    nodes += [names.host(i) for i in range(MAX_HOSTS_WITH_CONTROLLER)]
    nodes += [names.leaf(k) for k in range(MAX_LEAVES)]
    tokens = {f"mininet:{n}" for n in nodes}
    return [c for c in cmdlines_mentioning("mininet:") if c.split()[-1] in tokens]


def switch_sockets(names: RunNames) -> list[Path]:
    """The P4Runtime sockets of a run's switches (the spine or only switch, the leaves)
    that are still there."""
    from homagg.lab.switch_process import p4runtime_socket
    from run.net import MAX_LEAVES

    switches = [names.switch] + [names.leaf(k) for k in range(MAX_LEAVES)]
    paths = [Path(p4runtime_socket(s).removeprefix("unix:")) for s in switches]
    return [p for p in paths if p.exists()]


def leftovers(text: str, out: Path) -> list[str]:
    """What a finished run left behind: its interfaces, its state file, its credentials,
    processes started with its output directory, its Mininet nodes' shells (and so their
    namespaces), its switches' P4Runtime sockets. Looked at as soon as it ends: a later
    run may take its number (and names) again."""
    from run.names import RunNames
    from run.state import our_links

    number = run_number(text)
    left = [f"process {c}" for c in cmdlines_mentioning(str(out))]
    if number is not None:
        names = RunNames(number)
        left += [f"interface {x}" for x in our_links(names)]
        left += [f"state file {names.state_file}"] if names.state_file.exists() else []
        left += [f"credentials {names.credentials_dir}"] if names.credentials_dir.exists() else []
        left += [f"node shell {c}" for c in mininet_shells(names)]
        left += [f"P4Runtime socket {p}" for p in switch_sockets(names)]
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
