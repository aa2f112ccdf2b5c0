"""A sparse embedding gradient through the lossless codec, by rows against flat, in one
process: the NCF tables of `make run` (20,000 x 16 users, 4,000 x 16 items) and a table of
1,000,000 rows (each rank looks up 128 rows a step, batch 64 with one negative each,
repeats included, as nn.Embedding(sparse=True) makes them), W = 2 and 4, the ranks in
lockstep over a simulated switch (homagg/worker/codecs/simulate.py).

"rows" is what homagg/worker/ddp/sparse_bucket.py does now: the rows are the codec's support keys,
the
sum comes back as rows. "flat" is what it did before (and still does after a codec that
cannot sum rows): flat indices and values into `aggregate`, the rows' own bitmap on the
codec's OR phase, the table-sized sum scanned for its rows; with one support key per row
(support_block 16, as make run) and per element (the default of attach). CPU is each
rank's thread time for the whole bucket (COO in, phases, COO out), the paths alternating
step by step; every step's sums are checked the same on both paths, bit for bit.

    python -m bench.sparse_rows [--steps 40]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Generator
from typing import Any

import numpy as np
import torch

from bench.publish import publish
from homagg.wire.constants import CELLS_PER_PKT
from homagg.worker.codecs import LosslessSparse, Phase, drive
from homagg.worker.ddp.sparse_bucket import SparseBucket

TABLES = ((20_000, 16), (4_000, 16), (1_000_000, 16))  # make run's NCF, and a big table
LOOKUPS = 128  # per rank and step: batch 64, one negative per positive
PATHS: dict[str, tuple[dict[str, Any], bool]] = {  # name -> (codec options, by rows)
    "rows": ({}, True),
    "flat, support_block 16": ({"support_block": 16}, False),
    "flat, support_block 1": ({}, False),
}


class Flat:
    """The lossless codec without its rows: what a codec that cannot sum rows gets."""

    def __init__(self, codec: LosslessSparse) -> None:
        self.codec = codec

    def aggregate(self, x: Any) -> Generator[Phase, np.ndarray, np.ndarray]:
        return self.codec.aggregate(x)


def gradients(world: int, nrows: int, width: int, step: int) -> list[torch.Tensor]:
    """Each rank's uncoalesced embedding gradient of one step."""
    out = []
    for rank in range(world):
        g = torch.Generator().manual_seed(7919 * step + rank)
        rows = torch.randint(0, nrows, (1, LOOKUPS), generator=g)
        vals = torch.randn(LOOKUPS, width, generator=g)
        out.append(torch.sparse_coo_tensor(rows, vals, (nrows, width)))
    return out


def timed(
    gen: Generator[Phase, np.ndarray, np.ndarray], spent: list[float]
) -> Generator[Phase, np.ndarray, np.ndarray]:
    """`gen`, its thread time added to spent[0]."""
    reply = None
    while True:
        start = time.thread_time()
        try:
            phase = next(gen) if reply is None else gen.send(reply)
        except StopIteration as done:
            spent[0] += time.thread_time() - start
            return done.value
        spent[0] += time.thread_time() - start
        reply = yield phase


def one_step(codecs: list[Any], gs: list[torch.Tensor]) -> tuple[float, list[Phase], Any]:
    """One bucket step on every rank: (mean CPU s per rank, the phases, rank 0's sum)."""
    spent = [0.0]
    start = time.thread_time()
    buckets = [SparseBucket(g) for g in gs]
    spent[0] += time.thread_time() - start
    log: list[Phase] = []
    outs = drive([timed(b.phases(c), spent) for b, c in zip(buckets, codecs)], phases_log=log)
    start = time.thread_time()
    sums = [b.result(o) for b, o in zip(buckets, outs)]
    spent[0] += time.thread_time() - start
    return spent[0] / len(gs), log, sums[0]


def measure(world: int, nrows: int, width: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """Every path on one table and W, alternating step by step."""
    codecs = {
        name: [
            LosslessSparse(world, **opts) if rows else Flat(LosslessSparse(world, **opts))
            for _ in range(world)
        ]
        for name, (opts, rows) in PATHS.items()
    }
    got: dict[str, dict[str, list[float]]] = {
        name: {k: [] for k in ("cpu", "phases", "cells", "packets")} for name in PATHS
    }
    for step in range(steps + 2):  # two warm-up steps
        gs = gradients(world, nrows, width, step)
        order = list(PATHS) if step % 2 == 0 else list(PATHS)[::-1]
        sums = {}
        for name in order:
            cpu, log, sums[name] = one_step(codecs[name], gs)
            if step >= 2:
                g = got[name]
                g["cpu"].append(cpu)
                g["phases"].append(len(log))
                g["cells"].append(sum(p.cells.size for p in log))
                g["packets"].append(sum(math.ceil(p.cells.size / CELLS_PER_PKT) for p in log))
        first = sums["rows"]
        for name, s in sums.items():
            assert torch.equal(s.indices(), first.indices()), name
            assert torch.equal(s.values().view(torch.int32), first.values().view(torch.int32))
    return got


def table(steps: int) -> list[str]:
    """The markdown table: every W, table and path (medians over the steps)."""
    lines = [
        "| W | table | path | CPU ms / rank / step | switch phases | cells / rank | "
        "packets / rank | CPU vs rows |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for world in (2, 4):
        for nrows, width in TABLES:
            got = measure(world, nrows, width, steps)
            base = statistics.median(got["rows"]["cpu"])
            for name, g in got.items():
                cpu, med = g["cpu"], {k: statistics.median(v) for k, v in g.items()}
                lines.append(
                    f"| {world} | {nrows:,} x {width} | {name} | {med['cpu'] * 1e3:.2f} "
                    f"[{min(cpu) * 1e3:.2f}, {max(cpu) * 1e3:.2f}] | {med['phases']:g} | "
                    f"{med['cells']:,.0f} | {med['packets']:g} | {med['cpu'] / base:.2f}x |"
                )
    return lines


def main(argv: list[str] | None = None) -> None:
    """Command line: the table, to bench/results/sparse_rows.md."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=40, help="measured steps per table and W")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    start = time.monotonic()
    lines = table(a.steps)
    head = [
        "# A sparse embedding gradient through the lossless codec: by rows and flat",
        "",
        f"`python -m bench.sparse_rows --steps {a.steps}`; {platform.machine()}, "
        f"{os.cpu_count()} cores, {(time.monotonic() - start) / 60:.1f} min. Per rank and "
        f"step: {LOOKUPS} looked-up rows (repeats included), the ranks in lockstep in one "
        "process; CPU: median [min, max] thread time per rank for the bucket (COO in, the "
        "codec's phases, COO out); phases, cells and packets: what each rank sends (median "
        "over the steps); the sums were bit for bit the same on every path at every step.",
        "",
    ]
    publish("sparse_rows", head + lines)


if __name__ == "__main__":
    main()
