"""The one-line summary `make bench` prints last, read from bench/results/*.md: the
aggregation target, the switches' packet rates, then each part's own summary line.

python -m bench.summary SECONDS [--suffix _full]

With --suffix, each part's results are read from <name><suffix>.md when that file exists
(BENCH=full writes those), else from <name>.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys

from bench.publish import RESULTS

# Parts whose own "Summary: ..." line joins the summary, in this order.
PARTS = (
    "worker_rate",
    "training",
    "peers",
    "regimes",
    "lowbit",
    "overlap",
    "projection_check",
    "projection",
    "tree_scaling",
)


def _find(name: str, pattern: str, suffix: str = "") -> str | None:
    path = RESULTS / f"{name}{suffix}.md"
    if suffix and not path.exists():
        path = RESULTS / f"{name}.md"
    if not path.exists():
        return None
    m = re.search(pattern, path.read_text(), re.M)
    return m.group(1) if m else None


def line(seconds: float, suffix: str = "") -> str:
    """The summary line of the results in bench/results."""
    parts = [f"bench: {platform.machine()}, {os.cpu_count()} cores, {seconds / 60:.1f} min"]
    agg = _find(
        "aggregation",
        r"^Target [^:]*: lossless vs dense fixed point at 1% density, "
        r"reference switch, n = ([\d,]+: .*)\.$",
        suffix,
    )
    if agg:  # "n: ratios"
        n, ratios = agg.split(": ", 1)
        parts.append(f"lossless / fixed point at 1% (refswitch, n = {n}): {ratios}")
    for a, b, text in (
        ("refswitch", "bmv2", "refswitch / BMv2"),
        ("bmv2-opt", "bmv2", "optimized / default BMv2"),
        ("ebpf", "refswitch", "eBPF / refswitch"),
        ("ebpf-xdp", "ebpf", "eBPF with / without its XDP stage"),
    ):
        rate = _find("switch_rate", rf"^\| 256 \| ADD \| {a} / {b} \| ([\d.]+x)", suffix)
        if rate:
            parts.append(f"{text} packet rate (256 cells): {rate}")
    for name in PARTS:
        found = _find(name, r"^Summary: (.*)\.$", suffix)
        if found:
            parts.append(found)
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.summary", description=__doc__)
    p.add_argument("seconds", type=float, nargs="?", default=float("nan"))
    p.add_argument("--suffix", default="", help="read <name><suffix>.md first (e.g. _full)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    print(line(args.seconds, args.suffix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
