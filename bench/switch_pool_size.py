"""Largest loss-free pool size per switch target: bursts of `pool size` contributions per
worker (4 workers, sent back to back as a worker's pool of slots in flight allows), every
result awaited; a pool size is loss-free when no result of any burst went missing. Also the
packet rate it reached.

--offloads-on leaves the switch ports' segmentation offloads as a fresh veth has them,
as switches were started before the fix: libpcap then gives BMv2 a capture ring of 31
frames per port (docs/bmv2.md). Writes bench/results/switch_pool_size.md.

    python -m bench.switch_pool_size [--pool-sizes 8 16 32 64 128 256 512] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.publish import heading, publish
from homagg.wire.constants import NUM_SLOTS

WORKERS = 4
# testnet's Job puts job k's pool at slot 64 k (mod NUM_SLOTS - 64) and a sweep's jobs are
# the process's first few, so their pools start below half the switch's slots: pools of up
# to the other half fit (sweep checks it).
MAX_POOL_SIZE = NUM_SLOTS // 2


def burst(job, pool_size: int, first_chunk: int) -> tuple[int, float]:
    """Send `pool_size` contributions from every worker, await every result: (results that
    did not arrive, contributions per second until the last one arrived)."""
    import numpy as np

    from homagg.lab.aggjob import random_cells

    rng = np.random.default_rng(first_chunk)
    cells = [random_cells(rng) for _ in range(job.world_size)]
    frames = [
        (
            job.hosts[r].raw,
            job.frame(r, cells[r], slot=k % pool_size, shadow=(k // pool_size) % 2, chunk=k),
        )
        for k in range(first_chunk, first_chunk + pool_size)
        for r in range(job.world_size)
    ]
    # Generous: BMv2 absorbs ~1,000-8,000 contributions/s on a loaded 2-core machine.
    timeout = 3.0 + len(frames) / 300
    start = time.perf_counter()
    for port, frame in frames:
        port.send(frame)
    got = [len(job.hosts[r].raw.receive(timeout, count=pool_size)) for r in range(job.world_size)]
    elapsed = time.perf_counter() - start
    missing = pool_size * job.world_size - sum(got)
    if missing:  # late results must not count in the next burst
        time.sleep(1.0)
        job.fabric.drain()
    return missing, len(frames) / elapsed


def sweep(target: str, pool_sizes: list[int], reps: int) -> list[dict]:
    """Per pool size: results missing over `reps` bursts, and the median rate, on a fresh
    job."""
    from homagg.lab.aggjob import Job
    from homagg.lab.fabric import Fabric

    rows = []
    with Fabric(target, WORKERS) as fabric:
        chunk = 0
        for size in pool_sizes:
            job = Job(fabric, fabric.hosts, pool_size=size)
            if job.entries.pool_base + size > NUM_SLOTS:
                raise ValueError(f"pool size {size} does not fit the switch's slots")
            burst(job, size, chunk)  # warm-up, not counted
            missing, rates = 0, []
            for _ in range(reps):
                chunk += 2 * size
                miss, rate = burst(job, size, chunk)
                missing += miss
                rates.append(rate)
            chunk += 2 * size
            rows.append({"pool_size": size, "missing": missing, "rate": statistics.median(rates)})
            print(
                f"  {target} pool size {size}: {missing} of {reps * size * WORKERS} missing, "
                f"{rows[-1]['rate']:,.0f} contributions/s",
                flush=True,
            )
    return rows


def largest_loss_free(rows: list[dict]) -> int:
    """The largest pool size up to which no burst lost a result; 0 if the first did."""
    best = 0
    for row in sorted(rows, key=lambda r: r["pool_size"]):
        if row["missing"]:
            break
        best = row["pool_size"]
    return best


def report(results: dict[str, list[dict]], reps: int, offloads_on: bool) -> list[str]:
    """The markdown table of bench/results/switch_pool_size.md."""
    ports = "segmentation offloads ON (as before the fix)" if offloads_on else "offloads off"
    lines = [
        heading("Loss-free pool size"),
        "",
        f"{WORKERS} workers, each sending a burst of `pool size` contributions back to back, "
        f"{reps} bursts per pool size; switch ports: {ports}.",
        "",
        "| target | pool size | results missing | contributions/s (median) |",
        "|---|---:|---:|---:|",
    ]
    for target, rows in results.items():
        for row in rows:
            lines.append(
                f"| {target} | {row['pool_size']} | {row['missing']} of "
                f"{reps * row['pool_size'] * WORKERS} | {row['rate']:,.0f} |"
            )
    lines.append("")
    lines += [
        f"- {target}: largest loss-free pool size {largest_loss_free(rows)}"
        for target, rows in results.items()
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the sweep on every available target and write bench/results/switch_pool_size.md."""
    p = argparse.ArgumentParser(
        prog="python -m bench.switch_pool_size",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pool-sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512])
    p.add_argument("--reps", type=int, default=3, help="bursts per pool size (default 3)")
    p.add_argument(
        "--targets", nargs="+", default=None, help="default: refswitch, and bmv2 when installed"
    )
    p.add_argument(
        "--offloads-on",
        action="store_true",
        help="leave the switch ports' offloads on, to reproduce the loss before the fix",
    )
    args = p.parse_args(argv)
    if any(not 1 <= size <= MAX_POOL_SIZE for size in args.pool_sizes):
        p.error(f"pool sizes must be within 1..{MAX_POOL_SIZE} (the pool must fit the switch)")
    from homagg.lab import switch_process

    targets = args.targets or switch_process.compared_targets()
    if args.offloads_on:
        switch_process.prepare_ports = lambda ports: None
    results = {t: sweep(t, sorted(args.pool_sizes), args.reps) for t in targets}
    name = "switch_pool_size_offloads_on" if args.offloads_on else "switch_pool_size"
    publish(
        name,
        report(results, args.reps, args.offloads_on),
        summary=", ".join(
            f"{t} loss-free pool size {largest_loss_free(r)}" for t, r in results.items()
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
