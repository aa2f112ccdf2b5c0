"""The one-line summary `make bench` prints last, read from bench/results/*.md.

python -m bench.summary SECONDS
"""

from __future__ import annotations

import os
import platform
import re
import sys

from bench.publish import RESULTS


def _find(name: str, pattern: str) -> str | None:
    path = RESULTS / name
    if not path.exists():
        return None
    m = re.search(pattern, path.read_text(), re.M)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    seconds = float(argv[0]) if argv else float("nan")
    parts = [f"bench: {platform.machine()}, {os.cpu_count()} cores, {seconds / 60:.1f} min"]
    agg = _find(
        "aggregation.md",
        r"^Target [^:]*: lossless vs dense fixed point at 1% density, "
        r"reference switch, n = [\d,]+: (.*)\.$",
    )
    if agg:
        parts.append(f"lossless / fixed point at 1% (refswitch, 25M): {agg}")
    rate = _find("switch_rate.md", r"^\| 256 \| refswitch / bmv2 \| ([\d.]+x)")
    if rate:
        parts.append(f"refswitch / BMv2 packet rate (256 cells): {rate}")
    train = _find("training.md", r"^SUMMARY (.*)$") or _find("training.md", r"^Summary: (.*)\.$")
    if train:
        parts.append(train)
    peers = _find("peers.md", r"^Summary: (.*)\.$")
    if peers:
        parts.append(peers)
    print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
