"""Remove what interrupted fabrics left behind (`make stop`): their namespaces, links and
switch processes, found by the names and PID files they own, never by a process name."""

from __future__ import annotations

import os
import signal
import sys

from homagg.lab.fabric import PID_DIR, TAG_PATTERN
from homagg.lab.namespace import delete_link, delete_namespace, have_privileges, ip


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(include_live: bool = False) -> list[str]:
    """Remove leftovers of fabrics whose owner process is gone (or all, with include_live)."""
    removed = []
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show", check=False).stdout.splitlines()
    ]
    namespaces = [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines()]
    for name in namespaces + links:
        m = TAG_PATTERN.match(name)
        if m and (include_live or not _alive(int(m.group(1)))):
            (delete_namespace if name in namespaces else delete_link)(name)
            removed.append(name)
    if PID_DIR.exists():
        for pid_file in PID_DIR.glob("hg*.pid"):
            owner = int(pid_file.stem[2:].split("x")[0])
            if include_live or not _alive(owner):
                pid = int(pid_file.read_text() or 0)
                if pid and _alive(pid):
                    os.killpg(pid, signal.SIGKILL)  # the switch leads its own session
                    removed.append(f"switch pid {pid}")
                pid_file.unlink()
    return removed


def main() -> int:
    """Command line: python -m homagg.lab.cleanup [--all]."""
    if not have_privileges():
        print("cleanup needs root", file=sys.stderr)
        return 2
    removed = cleanup(include_live="--all" in sys.argv[1:])
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
