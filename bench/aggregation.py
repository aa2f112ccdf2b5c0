"""Aggregation throughput: gradient elements aggregated per second per worker, for one
float32 tensor at several densities, W = 2 and 4, side by side in one run.

Methods: torch.distributed gloo all_reduce of the dense tensor (W processes, FileStore,
loopback; the process group stays up and is told when to run, so it alternates with the
switch runs), and through the switch, W workers as threads of this process (one
namespace and one UDP socket each, SwitchTransport driving the codec, as in
tests/worker/test_transport.py): dense fixed point (FixedPoint), the lossless codec
(LosslessSparse, its default values="ranked"; at 1% density also values="sketch", the
count sketch with peeling) and CLT-k (ratio = density). Every repetition runs every method once
in turn (targets alternate), so the tables give the median and [min, max] over
repetitions and ratios of medians of the same run. Codec objects live across
repetitions, as in training (one per bucket). Fixed point and gloo send the same
bytes whatever the density, so they are measured once per W and repetition.

The reference switch and the eBPF target get the full tensor (--n, 25M); BMv2 forwards
several times fewer packets per second (bench/switch_rate.py), so it gets --bmv2-n
elements (1M) and fewer repetitions. --targets picks the switches (default: the reference
switch, and BMv2 where installed).

    python -m bench.aggregation [--n 25000000] [--bmv2-n 1000000] [--reps 5] [--bmv2-reps 2]
        [--targets refswitch bmv2 ebpf] [--io batched|python] [--name aggregation]

--io picks the workers' transport I/O path (homagg/worker/transport/io_path.py);
bench/worker_rate.py measures both paths' packet rate side by side with these groups.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.publish import heading, plot_path, publish, pyplot
from homagg.worker.transport.io_path import IO_PATHS

if TYPE_CHECKING:
    from homagg.lab.aggjob import RankTraffic

DENSITIES = (0.001, 0.01, 0.1)
WORLD_SIZES = (2, 4)
POOL_SIZE = 32
SKETCH_DENSITY = 0.01  # the count-sketch variant is measured at this density only
JOIN_TIMEOUT = 600.0  # seconds for one aggregation step of W workers


# ---------------------------------------------------------------- gloo baseline


def _gloo_rank(
    rank: int, world_size: int, store: str, sizes: list[int], worlds: tuple[int, ...], cmd, res
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    groups = {
        w: (None if w == world_size else dist.new_group(list(range(w))))
        for w in worlds
        if w <= world_size
    }
    tensors = {n: torch.zeros(n, dtype=torch.float32) for n in sizes}
    for t in tensors.values():
        t[::100] = 1.0
    while True:
        msg = cmd.get()
        if msg is None:
            break
        w, n = msg
        if rank < w:
            dist.barrier(group=groups[w])
            start, cpu = time.perf_counter(), time.process_time()
            dist.all_reduce(tensors[n], group=groups[w])
            res.put((rank, time.perf_counter() - start, time.process_time() - cpu))
        else:
            res.put((rank, None, 0.0))
    dist.destroy_process_group()


class GlooPool:
    """max(worlds) gloo ranks kept up (each with a group of its first w ranks for every w in
    worlds); run(w, n) times one all_reduce of n elements on the first w."""

    def __init__(self, sizes: list[int], worlds: tuple[int, ...] = WORLD_SIZES) -> None:
        ctx = mp.get_context("spawn")
        self.tmp = tempfile.TemporaryDirectory(prefix="homagg-gloo-")
        world_size = max(worlds)
        self.cmds = [ctx.Queue() for _ in range(world_size)]
        self.res = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_gloo_rank,
                daemon=True,
                args=(
                    r,
                    world_size,
                    f"{self.tmp.name}/store",
                    sizes,
                    worlds,
                    self.cmds[r],
                    self.res,
                ),
            )
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def run(self, w: int, n: int) -> float:
        return self.run_cpu(w, n)[0]

    def run_cpu(self, w: int, n: int) -> tuple[float, float]:
        """One all_reduce of n elements on the first w ranks: (the slowest rank's wall
        seconds, CPU seconds of all w ranks together)."""
        for q in self.cmds:
            q.put((w, n))
        got = [self.res.get(timeout=300) for _ in self.cmds]
        return max(g[1] for g in got if g[1] is not None), sum(g[2] for g in got)

    def close(self) -> None:
        for q in self.cmds:
            q.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.tmp.cleanup()


# ---------------------------------------------------------------- through the switch


class SwitchGroup:
    """A job's workers, one SwitchTransport each: by default a job on a fabric's first w
    hosts; `job` gives another (e.g. a two-level TreeJob, bench/tree_scaling.py)."""

    def __init__(
        self,
        fabric,
        w: int,
        initial_timeout: float,
        io_path: str = "",
        job: RankTraffic | None = None,
    ) -> None:
        from homagg.lab.aggjob import Job
        from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

        self.w = w
        self.job = job if job is not None else Job(fabric, fabric.hosts[:w], pool_size=POOL_SIZE)
        if self.job.world_size != w:
            raise ValueError(f"a job of {self.job.world_size} ranks for a group of {w}")
        self.transports = []
        for r in range(w):
            cfg = TransportConfig(
                job_id=self.job.job_id,
                rank=r,
                world_size=w,
                pool_size=POOL_SIZE,
                initial_timeout=initial_timeout,
                io_path=io_path,
            )
            self.transports.append(SwitchTransport(cfg, self.job.channel(r)))

    def step(self, codecs: list, xs: list[np.ndarray]) -> tuple[float, list[np.ndarray], int]:
        """One aggregation of xs[r] by codecs[r] on every worker: (wall s, results, retx)."""
        from homagg.lab.threads import run_threads

        def work(r: int) -> np.ndarray:  # the codec's work too runs in the worker's thread
            return self.transports[r].run(codecs[r].aggregate(xs[r]))

        retx0 = sum(t.stats.retransmissions for t in self.transports)
        elapsed, results = run_threads([partial(work, r) for r in range(self.w)], JOIN_TIMEOUT)
        return elapsed, results, sum(t.stats.retransmissions for t in self.transports) - retx0

    def close(self) -> None:
        for t in self.transports:
            t.channel.close()


def sparse_inputs(
    rng: np.random.Generator, n: int, world_size: int, density: float
) -> list[np.ndarray]:
    """Per worker a float32 tensor with `density` nonzeros at independent positions."""
    k = max(1, int(n * density))
    xs = []
    for _ in range(world_size):
        x = np.zeros(n, np.float32)
        idx = rng.integers(0, n, k)  # with replacement: ~k distinct, much faster than choice()
        x[idx] = rng.standard_normal(k).astype(np.float32)
        xs.append(x)
    return xs


def make_codecs(method: str, w: int, density: float) -> list:
    from homagg.worker.codecs import CLTK, FixedPoint, LosslessSparse

    if method == "fixed_point":
        return [FixedPoint(w) for _ in range(w)]
    if method == "lossless":
        return [LosslessSparse(w) for _ in range(w)]
    if method == "lossless_sketch":
        return [LosslessSparse(w, values="sketch") for _ in range(w)]
    return [CLTK(w, r, ratio=density) for r in range(w)]


def measure_target(
    target: str, n: int, reps: int, gloo: GlooPool, record: dict, io_path: str = ""
) -> None:
    """Alternate every method on `target` (and gloo at the same n), reps times."""
    from homagg.lab.fabric import Fabric

    rng = np.random.default_rng(0)
    inputs = {(w, d): sparse_inputs(rng, n, w, d) for w in WORLD_SIZES for d in DENSITIES}
    timeout = 0.2 if target.startswith("bmv2") else 0.02  # BMv2 answers slower
    # One fabric per W: a job's worker UDP ports are fixed per rank (homagg.lab.aggjob).
    fabrics, groups, codecs = {}, {}, {}
    try:
        for w in WORLD_SIZES:
            fabrics[w] = Fabric(target, w)
            for h in fabrics[w].hosts:
                h.enable_ip_stack()
            groups[w] = SwitchGroup(fabrics[w], w, timeout, io_path)
        for w in WORLD_SIZES:  # warm-up: one small step per method
            for m in ("fixed_point", "lossless", "lossless_sketch", "cltk"):
                groups[w].step(make_codecs(m, w, 0.01), [x[:100_000] for x in inputs[(w, 0.01)]])
        for rep in range(reps):
            for w in WORLD_SIZES:
                plan = (
                    [("gloo", None), ("fixed_point", None)]
                    + [(m, d) for d in DENSITIES for m in ("lossless", "cltk")]
                    + [("lossless_sketch", SKETCH_DENSITY)]
                )
                for method, d in plan:
                    if method == "gloo":
                        secs, retx = gloo.run(w, n), 0
                    else:
                        xs = inputs[(w, d if d is not None else 0.01)]
                        codec_key = (w, method, d)
                        # kept across repetitions, as training keeps one per bucket
                        if codec_key not in codecs:
                            codecs[codec_key] = make_codecs(method, w, d or 0.01)
                        secs, out, retx = groups[w].step(codecs[codec_key], xs)
                        if any(not np.array_equal(out[0], o) for o in out[1:]):
                            raise RuntimeError(f"{method} W={w}: workers decoded different sums")
                    key = (target, n, w, method, d)
                    record.setdefault(key, {"secs": [], "retx": 0})
                    record[key]["secs"].append(secs)
                    record[key]["retx"] += retx
                    print(
                        f"  {target} n={n:,} rep {rep + 1}/{reps} W={w} {method}"
                        f"{'' if d is None else f' {d:.1%}'}: {secs:.2f} s, "
                        f"{n / secs / 1e6:.2f} M elem/s/worker, retx {retx}",
                        flush=True,
                    )
    finally:
        for g in groups.values():
            g.close()
        for f in fabrics.values():
            f.close()


# ---------------------------------------------------------------- report

LABELS = {
    "gloo": "gloo all_reduce (dense)",
    "fixed_point": "switch, dense fixed point",
    "lossless": "switch, lossless",
    "lossless_sketch": "switch, lossless (count sketch)",
    "cltk": "switch, CLT-k (ratio = density)",
}


def _rate(secs: list[float], n: int) -> str:
    r = [n / s / 1e6 for s in secs]
    return f"{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]"


def report(record: dict, elapsed: float, args) -> tuple[list[str], str]:
    """The results' markdown lines and the one-line summary (the 10x target)."""
    lines = _intro(elapsed, args)
    summary = ""
    for target, n in sorted({(k[0], k[1]) for k in record}, key=lambda t: t[0] != "refswitch"):
        lines += _target_table(record, target, n)
        if target == "refswitch":
            summary = _target_summary(record, n)
            lines += [f"Target lossless >= 10x dense fixed point at 1% density: {summary}.", ""]
    return lines, summary


def _intro(elapsed: float, args) -> list[str]:
    lines = [
        heading("Aggregation throughput"),
        "",
        f"`python -m bench.aggregation --n {args.n} --bmv2-n {args.bmv2_n} --reps {args.reps} "
        f"--bmv2-reps {args.bmv2_reps}{_targets_flag(args)}"
        f"{f' --io {args.io}' if getattr(args, 'io', '') else ''}`; ran in {elapsed:.0f} s. "
        f"Plot: {getattr(args, 'name', 'aggregation')}.png.",
        "",
        "Million gradient elements aggregated per second per worker (n / wall time of one "
        "aggregation step of all W workers, the codec's encode and decode included), "
        "median [min, max] over repetitions; every repetition ran every row once, in turn. "
        "Inputs: one float32 tensor per worker with the given density of nonzeros at "
        "independent positions. Switch workers are threads of one process (one namespace "
        f"and UDP socket each, pool size {POOL_SIZE}); gloo ranks are processes on loopback. "
        "Codec objects are kept across repetitions, as training keeps one per bucket. "
        "Fixed point and gloo do not depend on the density (measured once per W and "
        'repetition, on the 1% input). "lossless" is `LosslessSparse`\'s default (values '
        'sent at their rank in the union support); "lossless (count sketch)" sends them in '
        'a count sketch decoded by peeling (`values="sketch"`), measured at '
        f"{SKETCH_DENSITY:.0%} only.",
        "",
    ]
    return lines


NAMES = {"refswitch": "reference switch", "bmv2": "BMv2", "bmv2-opt": "BMv2 -O3", "ebpf": "eBPF"}


def _targets_flag(args) -> str:
    """The --targets and --name flags as given (nothing when left at their defaults)."""
    out = f" --targets {' '.join(args.targets)}" if getattr(args, "targets", None) else ""
    name = getattr(args, "name", "aggregation")
    return out + (f" --name {name}" if name != "aggregation" else "")


def _target_table(record: dict, target: str, n: int) -> list[str]:
    """One target's table: every W, method and density against gloo and fixed point."""
    lines = [
        f"### {NAMES[target]}, n = {n:,} elements"
        + (
            " (smaller tensor: BMv2 forwards several times fewer packets/s)"
            if target.startswith("bmv2")
            else ""
        ),
        "",
        "| W | method | density | M elem/s/worker | vs gloo | vs fixed point | retx |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for w in WORLD_SIZES:
        base = {
            m: statistics.median(record[(target, n, w, m, None)]["secs"])
            for m in ("gloo", "fixed_point")
        }
        for m in ("gloo", "fixed_point"):
            rec = record[(target, n, w, m, None)]
            lines.append(
                f"| {w} | {LABELS[m]} | any | {_rate(rec['secs'], n)} | "
                f"{base['gloo'] / statistics.median(rec['secs']):.2f}x | "
                f"{base['fixed_point'] / statistics.median(rec['secs']):.2f}x | {rec['retx']} |"
            )
        for d in DENSITIES:
            for m in ("lossless", "cltk", "lossless_sketch"):
                if (target, n, w, m, d) not in record:
                    continue
                rec = record[(target, n, w, m, d)]
                med = statistics.median(rec["secs"])
                lines.append(
                    f"| {w} | {LABELS[m]} | {d:.1%} | {_rate(rec['secs'], n)} | "
                    f"{base['gloo'] / med:.2f}x | {base['fixed_point'] / med:.2f}x | "
                    f"{rec['retx']} |"
                )
    lines.append("")
    return lines


def _target_summary(record: dict, n: int) -> str:
    """Lossless vs dense fixed point at 1% density on the reference switch, per W, and
    whether every W meets the 10x target."""
    ratios = {
        w: statistics.median(record[("refswitch", n, w, "fixed_point", None)]["secs"])
        / statistics.median(record[("refswitch", n, w, "lossless", 0.01)]["secs"])
        for w in WORLD_SIZES
    }
    met = all(r >= 10 for r in ratios.values())
    return (
        "lossless vs dense fixed point at 1% density, reference switch, n = "
        f"{n:,}: "
        + ", ".join(f"W={w} {r:.1f}x" for w, r in ratios.items())
        + f" (target >= 10x: {'MET' if met else 'MISSED'})"
    )


def plot(record: dict, path: Path) -> None:
    plt = pyplot()

    keys = sorted({(k[0], k[1]) for k in record}, key=lambda t: t[0] != "refswitch")
    fig, axes = plt.subplots(
        len(keys), len(WORLD_SIZES), figsize=(5 * len(WORLD_SIZES), 3.6 * len(keys)), squeeze=False
    )
    for i, (target, n) in enumerate(keys):
        for j, w in enumerate(WORLD_SIZES):
            ax = axes[i][j]
            for m, style in (("gloo", "k--"), ("fixed_point", "b--")):
                rate = n / statistics.median(record[(target, n, w, m, None)]["secs"]) / 1e6
                ax.plot(
                    [d * 100 for d in DENSITIES], [rate] * len(DENSITIES), style, label=LABELS[m]
                )
            for m, style in (("lossless", "go-"), ("cltk", "rs-")):
                rates = [
                    n / statistics.median(record[(target, n, w, m, d)]["secs"]) / 1e6
                    for d in DENSITIES
                ]
                ax.plot([d * 100 for d in DENSITIES], rates, style, label=LABELS[m])
            sketch = record[(target, n, w, "lossless_sketch", SKETCH_DENSITY)]["secs"]
            ax.plot(
                [SKETCH_DENSITY * 100],
                [n / statistics.median(sketch) / 1e6],
                "g^",
                label=LABELS["lossless_sketch"],
            )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("density of nonzeros per worker (%)")
            ax.set_ylabel("M elements/s per worker")
            ax.set_title(f"{NAMES[target]}, n={n:,}, W={w}")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--n",
        type=int,
        default=25_000_000,
        help="elements per worker on the reference switch (default 25,000,000; the dense "
        "fixed-point rows take ~1 s per million at W = 4)",
    )
    p.add_argument(
        "--bmv2-n", type=int, default=1_000_000, help="elements per worker on BMv2 (default 1M)"
    )
    p.add_argument(
        "--reps", type=int, default=5, help="repetitions on the reference switch (default 5)"
    )
    p.add_argument("--bmv2-reps", type=int, default=2, help="repetitions on BMv2 (default 2)")
    p.add_argument("--no-bmv2", action="store_true", help="leave out the BMv2 rows")
    p.add_argument(
        "--targets",
        nargs="+",
        choices=["refswitch", "bmv2", "ebpf"],
        default=None,
        help="switch targets, in turn (default: refswitch, and bmv2 where installed); "
        "bmv2 gets --bmv2-n and --bmv2-reps, the others --n and --reps",
    )
    p.add_argument(
        "--io",
        choices=IO_PATHS,
        default="",
        help="the switch workers' transport I/O path (default: HOMAGG_TRANSPORT_IO, else "
        "batched); bench.worker_rate puts both side by side",
    )
    p.add_argument("--name", default="aggregation", help="results file stem")
    args = p.parse_args(argv)
    from homagg.lab.namespace import have_privileges
    from homagg.lab.switch_process import bmv2_available

    if not have_privileges():
        print("bench.aggregation needs root (network namespaces)", file=sys.stderr)
        return 1
    targets = args.targets or ["refswitch"] + (
        ["bmv2"] if bmv2_available() and not args.no_bmv2 else []
    )
    start = time.perf_counter()
    record: dict = {}
    gloo = GlooPool([args.n, args.bmv2_n])
    try:
        for target in targets:
            n, reps = (args.bmv2_n, args.bmv2_reps) if target == "bmv2" else (args.n, args.reps)
            print(f"aggregation: {NAMES[target]}, n = {n:,}, {reps} reps", flush=True)
            measure_target(target, n, reps, gloo, record, args.io)
    finally:
        gloo.close()
    lines, summary = report(record, time.perf_counter() - start, args)
    plot(record, plot_path(f"{args.name}.png"))
    publish(args.name, lines, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
