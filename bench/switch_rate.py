"""Switch packet rate, reference switch vs BMv2, measured side by side in one run.

Each target runs in its own fabric (4 hosts in namespaces); batches of a full pool
(32 slots x 4 workers) are sent as fast as the hosts can, then every result is awaited.
Targets alternate batch by batch so that a noisy neighbour hits both alike; the table
gives the median and spread of contributions absorbed per second, per cells-per-packet
setting (settings other than the committed program's are compiled on the fly:
they need p4c).
Writes bench/results/switch_rate.md and switch_rate.png.

    python -m bench.switch_rate [--cells 64 128 256] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.publish import plot_path, publish, pyplot

REPO = Path(__file__).resolve().parent.parent


def _measure(job, pool_size: int, batches: int, first_chunk: int) -> tuple[float, int]:
    """Contributions per second over `batches` full pools (sending and awaiting only),
    and the number of results that did not arrive."""
    import numpy as np

    from testnet.aggjob import random_cells

    rng = np.random.default_rng(first_chunk)
    cells = [random_cells(rng) for _ in range(job.world)]
    missing, elapsed = 0, 0.0
    for b in range(batches):
        chunks = range(first_chunk + b * pool_size, first_chunk + (b + 1) * pool_size)
        frames = [
            (
                job.hosts[r].raw,
                job.frame(r, cells[r], slot=k % pool_size, shadow=(k // pool_size) % 2, chunk=k),
            )
            for k in chunks
            for r in range(job.world)
        ]
        start = time.perf_counter()
        for port, frame in frames:
            port.send(frame)
        for r in range(job.world):
            missing += pool_size - len(job.hosts[r].raw.receive(2.0, count=pool_size))
        elapsed += time.perf_counter() - start
    return batches * pool_size * job.world / elapsed, missing


def run_child(cells: int, reps: int, artifacts: tuple[Path, Path] | None) -> dict:
    """Measure every available target with the current HOMAGG_CELLS_PER_PKT."""
    from testnet.aggjob import Job
    from testnet.fabric import Fabric
    from testnet.switch_process import bmv2_available

    targets = ["refswitch"] + (["bmv2"] if bmv2_available() else [])
    kwargs = {"artifacts": artifacts} if artifacts else {}
    fabrics = {t: Fabric(t, 4, **kwargs) for t in targets}
    try:
        jobs = {t: Job(f, f.hosts, pool_size=32) for t, f in fabrics.items()}
        rates: dict[str, list[float]] = {t: [] for t in targets}
        missing = {t: 0 for t in targets}
        chunk = 0
        for t in targets:
            _measure(jobs[t], 32, 1, chunk)  # warm-up
        for rep in range(reps):
            chunk += 1 << 12
            for t in targets:
                rate, miss = _measure(jobs[t], 32, 4, chunk)
                rates[t].append(rate)
                missing[t] += miss
            print(
                f"  cells {cells} rep {rep + 1}/{reps}: "
                + ", ".join(f"{t} {rates[t][-1]:.0f}/s" for t in targets),
                flush=True,
            )
        return {"cells": cells, "rates": rates, "missing": missing}
    finally:
        for f in fabrics.values():
            f.close()


def _compile(cells: int, out: Path) -> tuple[Path, Path] | None:
    from aggwire.constants import CELLS_PER_PKT

    if cells == CELLS_PER_PKT:  # the committed program
        return None
    if shutil.which("p4c") is None:
        print(f"  cells {cells}: skipped (p4c is needed to build that program)")
        return "skip"  # type: ignore[return-value]
    subprocess.run(
        ["make", "--no-print-directory", "-B", "p4", f"CELLS={cells}", f"P4_BUILD={out}"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return out / "homagg.p4info.txtpb", out / "homagg.json"


def plot(rows: list[dict], path: Path) -> None:
    """Packets/s and cells/s (median, min-max bars) by cells per packet, per target."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for t, style in (("refswitch", "o-"), ("bmv2", "s-")):
        pts = [(r["cells"], r["rates"][t]) for r in rows if t in r["rates"]]
        if not pts:
            continue
        for ax, scale in ((axes[0], lambda c: 1), (axes[1], lambda c: c)):
            xs = [c for c, _ in pts]
            med = [statistics.median(v) * scale(c) for c, v in pts]
            err = [
                [m - min(v) * scale(c) for (c, v), m in zip(pts, med)],
                [max(v) * scale(c) - m for (c, v), m in zip(pts, med)],
            ]
            ax.errorbar(
                xs,
                med,
                yerr=err,
                fmt=style,
                capsize=3,
                label={"refswitch": "reference switch", "bmv2": "BMv2"}[t],
            )
    for ax, label in zip(axes, ("packets/s", "cells/s")):
        ax.set(xlabel="cells per packet", ylabel=label, xscale="log", yscale="log")
        ax.set_xticks(
            sorted({r["cells"] for r in rows}), [str(c) for c in sorted({r["cells"] for r in rows})]
        )
        ax.tick_params(axis="x", which="minor", labelbottom=False)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("switch packet rate, 4 workers, pool size 32")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench/results/switch_rate.md."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, nargs="+", default=[64, 128, 256], choices=[64, 128, 256])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--child", type=str, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        artifacts = tuple(Path(x) for x in args.child.split(",")) if args.child != "-" else None
        print(
            "RESULT "
            + json.dumps(run_child(int(os.environ["HOMAGG_CELLS_PER_PKT"]), args.reps, artifacts))
        )
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cells in args.cells:
            artifacts = _compile(cells, Path(tmp) / str(cells))
            if artifacts == "skip":
                continue
            env = dict(os.environ, HOMAGG_CELLS_PER_PKT=str(cells))
            child = ",".join(map(str, artifacts)) if artifacts else "-"
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.switch_rate",
                    "--reps",
                    str(args.reps),
                    "--child",
                    child,
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                check=True,
            )
            for line in proc.stdout.splitlines():
                if line.startswith("RESULT "):
                    rows.append(json.loads(line[7:]))
                else:
                    print(line)
    lines = [
        f"# Switch packet rate ({platform.machine()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        "Contributions absorbed per second (median of reps, [min, max]); 4 workers, "
        "pool size 32; targets alternate batch by batch.",
        "",
        "| cells/packet | target | packets/s | cells/s | missing results |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        for t, rates in row["rates"].items():
            med = statistics.median(rates)
            lines.append(
                f"| {row['cells']} | {t} | {med:,.0f} [{min(rates):,.0f}, "
                f"{max(rates):,.0f}] | {med * row['cells']:,.0f} | {row['missing'][t]} |"
            )
        if "bmv2" in row["rates"]:
            ratio = statistics.median(row["rates"]["refswitch"]) / statistics.median(
                row["rates"]["bmv2"]
            )
            lines.append(f"| {row['cells']} | refswitch / bmv2 | {ratio:.2f}x | | |")
    lines += ["", "![switch packet rate](switch_rate.png)"]
    plot(rows, plot_path("switch_rate.png"))
    publish("switch_rate", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
