"""`make stop`: remove what an interrupted `make run` left (processes in its host namespaces,
the process groups it started, its hgs1-/hgc0- interfaces; see run/state.py) and what an
interrupted demo fabric left (testnet.cleanup), by PID files and names we own only.

Example: python -m run.stop
"""

from __future__ import annotations

import sys

from run.state import cleanup
from testnet.cleanup import cleanup as cleanup_fabrics
from testnet.namespace import have_privileges


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if not have_privileges():
        print("make stop needs root", file=sys.stderr)
        return 2
    try:
        removed = cleanup()
    except RuntimeError as exc:
        print(f"make stop: {exc}", file=sys.stderr)
        return 1
    removed += cleanup_fabrics()
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
