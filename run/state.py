"""What a run started, on disk (<run directory>/state.json, run/names.py), so that `make stop`
can end it after an interruption by PID, network namespace and interface name, never by
process name. A run claims its number by creating that file exclusively."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

from homagg.lab.namespace import delete_link, ip
from run.names import MAX_RUNS, STATE_DIR, RunNames


def alive(pid: int) -> bool:
    """True when a process with this PID exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def netns_id(pid: int) -> str:
    """The network namespace of a process (a /proc link such as net:[4026532]), or ''."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def pids_in_netns(ns: str) -> list[int]:
    """Every process in network namespace `ns` (a host's namespace holds only our processes)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and netns_id(int(d.name)) == ns:
            found.append(int(d.name))
    return found


def our_links(names: RunNames) -> list[str]:
    """Root-namespace interfaces of run `names` (<switch>-ethN, <controller host>-eth0)."""
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show", check=False).stdout.splitlines()
    ]
    return [n for n in links if n.startswith(names.link_prefixes)]


class RunState:
    """Records PIDs (process groups we started) and host namespaces as they come up."""

    def __init__(self, names: RunNames) -> None:
        """Claim run `names`: FileExistsError when its state file exists (a live or an
        interrupted run owns that number)."""
        self.names = names
        self.path = names.state_file
        self.data: dict[str, list] = {"pgids": [], "netns": [], "owner": [os.getpid()]}
        self.data["uid"] = [os.geteuid()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(self.data, f)

    @staticmethod
    def claim() -> RunState:
        """The lowest run number never used, or whose directory is gone or empty (no output
        of an earlier run: a number is never reused while its plot is there), with no
        leftover interface, claimed."""
        for number in range(1, MAX_RUNS + 1):
            names = RunNames(number)
            if _holds_anything(names.directory) or our_links(names):
                continue
            try:
                return RunState(names)
            except (FileExistsError, FileNotFoundError):
                # another run claimed it between the check and the create, or an ending run
                # removed its empty directory meanwhile: try the next number
                continue
        raise RuntimeError(
            f"all {MAX_RUNS} run numbers are taken by live runs or earlier runs' output in "
            f"{STATE_DIR}: `make stop` stops interrupted runs; remove the run<K> directories "
            "whose output you no longer need"
        )

    def add(self, key: str, value: int | str) -> None:
        """Remember one process group or namespace and write the file."""
        self.data[key].append(value)
        self.path.write_text(json.dumps(self.data))

    def clear(self) -> None:
        """The run ended: nothing to remember, its credentials removed (the controller that
        trusted them is gone), and its directory too when no output is in it."""
        self.path.unlink(missing_ok=True)
        remove_credentials(self.names)


def _holds_anything(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except FileNotFoundError:
        return False


def remove_credentials(names: RunNames) -> list[str]:
    """Delete run `names`' credentials and its hosts file, and its directory when that
    leaves it empty; what was removed."""
    removed = []
    if names.credentials_dir.exists():
        shutil.rmtree(names.credentials_dir)
        removed.append(str(names.credentials_dir))
    names.hosts_file.unlink(missing_ok=True)
    if names.directory.exists() and not _holds_anything(names.directory):
        with contextlib.suppress(OSError):  # a new run may be claiming the number right now
            names.directory.rmdir()
    return removed


def stopped_runs_with_credentials() -> list[RunNames]:
    """Runs without a state file (ended, or stopped) whose credentials are still on disk
    (left by an earlier version that kept them)."""
    found = []
    for d in sorted(STATE_DIR.glob("run*")):
        number = d.name[3:]
        if number.isdigit() and 1 <= int(number) <= MAX_RUNS:
            names = RunNames(int(number))
            if names.credentials_dir.exists() and not names.state_file.exists():
                found.append(names)
    return found


def kill_group(pgid: int) -> bool:
    """SIGKILL a process group we started; False when it is gone already."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def recorded_runs(uid: int | None = None) -> list[RunNames]:
    """Runs with a state file (live or interrupted), of user `uid` when given."""
    found = []
    for d in sorted(STATE_DIR.glob("run*")):
        number = d.name[3:]
        if not number.isdigit() or not 1 <= int(number) <= MAX_RUNS:
            continue
        names = RunNames(int(number))
        try:
            data = json.loads(names.state_file.read_text() or "{}")
        except (OSError, ValueError):
            continue
        if uid is None or data.get("uid", [uid]) == [uid]:
            found.append(names)
    return sorted(found, key=lambda n: n.number)


def _end_owner(owners: list[int], wait: float) -> None:
    """SIGTERM a live run (it then stops everything itself) and wait for it to exit."""
    for pid in owners:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while any(alive(p) for p in owners):
        if time.monotonic() > deadline:
            raise RuntimeError(f"run (pid {owners}) did not stop within {wait:.0f} s; kill it")
        time.sleep(0.2)


def cleanup(names: RunNames, stop_live: bool = False, wait: float = 60.0) -> list[str]:
    """Remove what run `names` left: processes in its host namespaces, its process groups,
    its credentials, its interfaces. A live run is refused, or asked to stop first with
    `stop_live`."""
    removed: list[str] = []
    path = names.state_file
    if path.exists():
        data = json.loads(path.read_text() or "{}")
        owners = data.get("owner", [])
        if any(alive(p) for p in owners):
            if not stop_live:
                raise RuntimeError(
                    f"run {names.number} (pid {owners}) is still running; "
                    f"stop it with Ctrl-C or `make stop RUN={names.number}`"
                )
            _end_owner(owners, wait)
            removed.append(f"run {names.number} (pid {owners[0]}) stopped")
        for ns in data.get("netns", []):
            for pid in pids_in_netns(ns):
                os.kill(pid, signal.SIGKILL)
                removed.append(f"pid {pid} in {ns}")
        for pgid in data.get("pgids", []):
            if kill_group(pgid):
                removed.append(f"process group {pgid}")
        path.unlink(missing_ok=True)
    removed += remove_credentials(names)
    for name in our_links(names):
        delete_link(name)
        removed.append(name)
    return removed
