"""`make stop [RUN=N ...]`: stop `make run` number N (each run prints its number) and
remove what it made: processes in its host namespaces, the process groups it started, its
credentials, its hg<N>s-/hg<N>c- interfaces (see run/state.py). A live run is asked to stop
(SIGTERM) and cleans up itself first. Without a number: every run this user started,
listed, the credentials an ended run left, and what an interrupted demo fabric left
(homagg.lab.cleanup). By PIDs and names we own only.

Example: python -m run.stop 2
"""

from __future__ import annotations

import argparse
import os
import sys

from homagg.lab.cleanup import cleanup as cleanup_fabrics
from homagg.lab.namespace import have_privileges
from run.names import MAX_RUNS, RunNames
from run.state import cleanup, recorded_runs, remove_credentials, stopped_runs_with_credentials


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m run.stop",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs",
        type=int,
        nargs="*",
        metavar="RUN",
        help=f"run numbers (1..{MAX_RUNS}); default: every run this user started",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    args = _parser().parse_args(argv)
    if not have_privileges():
        print("make stop needs root", file=sys.stderr)
        return 2
    try:
        runs = [RunNames(n) for n in args.runs]
    except ValueError as exc:
        print(f"make stop: {exc}", file=sys.stderr)
        return 2
    everything = not runs
    if everything:
        runs = recorded_runs(os.geteuid())
        print("runs: " + (", ".join(str(r.number) for r in runs) if runs else "none"))
    removed: list[str] = []
    status = 0
    for names in runs:
        try:
            removed += cleanup(names, stop_live=True)
        except RuntimeError as exc:
            print(f"make stop: {exc}", file=sys.stderr)
            status = 1
    if everything:
        for names in stopped_runs_with_credentials():
            removed += remove_credentials(names)
        removed += cleanup_fabrics()
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return status


if __name__ == "__main__":
    sys.exit(main())
