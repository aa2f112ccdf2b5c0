"""What a run started, on disk (/tmp/homagg-run/state.json), so that `make stop` can end
it after an interruption by PID, network namespace and interface name, never by process name."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

from testnet.namespace import delete_link, ip

STATE_DIR = Path(tempfile.gettempdir()) / "homagg-run"
SWITCH_NAME = "hgs1"  # every root-namespace interface of a run starts with hgs1- or hgc0-
CONTROLLER_HOST = "hgc0"


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


class RunState:
    """Records PIDs (process groups we started) and host namespaces as they come up."""

    def __init__(self, path: Path = STATE_DIR / "state.json") -> None:
        self.path = path
        self.data: dict[str, list] = {"pgids": [], "netns": [], "owner": [os.getpid()]}
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, key: str, value: int | str) -> None:
        """Remember one process group or namespace and write the file."""
        self.data[key].append(value)
        self.path.write_text(json.dumps(self.data))

    def clear(self) -> None:
        """The run ended cleanly: nothing to remember."""
        self.path.unlink(missing_ok=True)


def kill_group(pgid: int) -> bool:
    """SIGKILL a process group we started; False when it is gone already."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def our_links() -> list[str]:
    """Root-namespace interfaces named like ours (hgs1-ethN, hgc0-eth0)."""
    names = [
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show", check=False).stdout.splitlines()
    ]
    return [n for n in names if n.startswith((f"{SWITCH_NAME}-", f"{CONTROLLER_HOST}-"))]


def cleanup(path: Path = STATE_DIR / "state.json") -> list[str]:
    """Remove what an interrupted run left (its owner must be gone): processes in its host
    namespaces, its process groups, its interfaces."""
    removed: list[str] = []
    if path.exists():
        data = json.loads(path.read_text() or "{}")
        if any(alive(p) for p in data.get("owner", [])):
            raise RuntimeError(
                f"the run that wrote {path} (pid {data['owner']}) is still running; "
                "stop it with Ctrl-C or kill that PID"
            )
        for ns in data.get("netns", []):
            for pid in pids_in_netns(ns):
                os.kill(pid, signal.SIGKILL)
                removed.append(f"pid {pid} in {ns}")
        for pgid in data.get("pgids", []):
            if kill_group(pgid):
                removed.append(f"process group {pgid}")
        path.unlink()
    for name in our_links():
        delete_link(name)
        removed.append(name)
    return removed
