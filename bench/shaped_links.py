"""Where links are the limit: dense fixed point (32 bits, exact) through the switch against
gloo's ring all_reduce, every link of a namespace fabric shaped to a rate (htb, as
Mininet's TCLink: homagg/lab/shaping.py), side by side at W = 4 and 8.

Each rank is one process living in its host's namespace: it holds a gloo process group over
its host's link (GLOO_SOCKET_IFNAME) and a switch worker (SwitchTransport) on the same link,
so both methods cross the same shaped links, switch and all. Every repetition runs every
link rate (unshaped first: the workers' packet rate there is the CPU's bound) and both
methods in turn, the order alternating between repetitions; the load average is recorded
with every step. Beside each point, what the links allow (bench/link_physics.py): the ring
sends 2(W-1)/W of the gradient per worker in TCP segments, the switch one copy in
aggregation packets (its exponent phase included), so the ideal ratio and goodput.

    python -m bench.shaped_links [--target ebpf] [--worlds 4 8] [--bw 100 1000]
        [--sizes 4000000] [--reps 3] [--name shaped_links]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.link_physics import link_bound, switch_header_bytes, switch_wire_share
from bench.publish import heading, plot_path, publish, pyplot

CORES = os.cpu_count() or 1
POOL_SIZE = 1024  # slots of the job's pool: chunks a worker has in flight (--pool)
STEP_TIMEOUT = 600.0  # seconds for one step of every rank
NAMES = {"refswitch": "reference switch", "ebpf": "eBPF", "bmv2": "BMv2"}
MAX_POOL = 1024  # a job's pool stays clear of the end of the switch's slots (pool_base_of)
TARGETS = {4: (1.3, 0.8), 8: (1.5, 0.8)}  # W: (switch / gloo speed-up, goodput share)


@dataclass(frozen=True)
class RankSetup:
    """What one rank's process needs: its host, the job and the gloo store."""

    rank: int
    world_size: int
    namespace: str
    iface: str
    ip: str
    service_ip: str
    job_id: int
    pool_size: int
    store: str
    sizes: tuple[int, ...]


def _transport(setup: RankSetup) -> Any:
    """The rank's switch worker: a UDP socket on its host (made in its namespace)."""
    from homagg.wire.constants import AGG_UDP_PORT, WORKER_UDP_BASE
    from homagg.worker.transport.channel import UdpChannel
    from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((setup.ip, WORKER_UDP_BASE + setup.rank))
    cfg = TransportConfig(
        job_id=setup.job_id, rank=setup.rank, world_size=setup.world_size, pool_size=setup.pool_size
    )
    return SwitchTransport(cfg, UdpChannel(sock, (setup.service_ip, AGG_UDP_PORT)))


def _rank_main(setup: RankSetup, cmd: Any, res: Any) -> None:
    """One rank: in its host's namespace for good, then one timed step per command."""
    from homagg.lab.namespace import enter_namespace

    enter_namespace(setup.namespace)  # before gloo's and torch's sockets and threads
    os.environ["GLOO_SOCKET_IFNAME"] = setup.iface
    import torch
    import torch.distributed as dist

    from homagg.worker.codecs import FixedPoint

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{setup.store}",
        rank=setup.rank,
        world_size=setup.world_size,
    )
    transport = _transport(setup)
    codec = FixedPoint(setup.world_size)  # kept across steps, as training keeps one per bucket
    rng = np.random.default_rng(setup.rank)
    xs = {n: rng.standard_normal(n).astype(np.float32) for n in setup.sizes}
    while (msg := cmd.get()) is not None:
        method, n = msg
        stats = transport.stats
        sent, retx = stats.packets_sent, stats.retransmissions
        t = torch.from_numpy(xs[n].copy())
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        if method == "gloo":
            dist.all_reduce(t)
            out = t.numpy()
        else:
            out = transport.run(codec.aggregate(xs[n]))
        secs, cpu = time.perf_counter() - start, time.process_time() - cpu
        digest = zlib.crc32(np.ascontiguousarray(out).tobytes())
        sent, retx = stats.packets_sent - sent, stats.retransmissions - retx
        res.put((setup.rank, secs, sent, retx, digest, cpu))
    transport.channel.close()
    dist.destroy_process_group()


class RankPool:
    """One process per host of a fabric's job, each a gloo rank and a switch worker."""

    def __init__(self, fabric: Any, job_id: int, pool_size: int, sizes: tuple[int, ...]) -> None:
        ctx = mp.get_context("spawn")
        self.tmp = tempfile.TemporaryDirectory(prefix="homagg-shaped-")
        w = len(fabric.hosts)
        self.cmds = [ctx.Queue() for _ in range(w)]
        self.res = ctx.Queue()
        self.procs = []
        for r, h in enumerate(fabric.hosts):
            setup = RankSetup(
                r, w, h.namespace, h.iface, h.ip, fabric.service_ip, job_id, pool_size,
                f"{self.tmp.name}/store", sizes,
            )  # fmt: skip
            p = ctx.Process(target=_rank_main, args=(setup, self.cmds[r], self.res), daemon=True)
            p.start()
            self.procs.append(p)

    def run(self, method: str, n: int) -> dict[str, float]:
        """One step of every rank: the slowest rank's seconds, packets a worker sent,
        retransmissions of all; a RuntimeError when the switch's ranks got different sums."""
        for q in self.cmds:
            q.put((method, n))
        got = [self._result() for _ in self.cmds]
        if len({g[4] for g in got}) != 1:
            raise RuntimeError(f"{method} n={n}: the ranks got different sums")
        return {
            "secs": max(g[1] for g in got),
            "packets": max(g[2] for g in got),
            "retx": sum(g[3] for g in got),
            "cpu": sum(g[5] for g in got),  # user + system seconds of every rank
            "load": os.getloadavg()[0],
        }

    def _result(self) -> tuple:
        """One rank's answer; a RuntimeError once a rank died or STEP_TIMEOUT passed."""
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                return self.res.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"rank(s) {dead} died (their traceback is above)") from None
        raise RuntimeError(f"no answer from every rank within {STEP_TIMEOUT:g} s")

    def close(self) -> None:
        for q in self.cmds:
            q.put(None)
        for p in self.procs:
            p.join(20)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.tmp.cleanup()


def measure_world(args: argparse.Namespace, w: int, record: dict) -> None:
    """Every repetition: every link rate (unshaped first) and both methods, alternating."""
    from homagg.lab.aggjob import Job
    from homagg.lab.fabric import Fabric
    from homagg.lab.shaping import shape_fabric

    fabric = Fabric(args.target, w)
    pool = None
    try:
        for h in fabric.hosts:
            h.enable_ip_stack()
        job = Job(fabric, fabric.hosts, pool_size=args.pool)
        pool = RankPool(fabric, job.job_id, args.pool, tuple(args.sizes))
        for method in ("gloo", "switch"):  # warm-up: connections, codec state
            pool.run(method, min(args.sizes))
        for rep in range(args.reps):
            order = ("gloo", "switch") if rep % 2 == 0 else ("switch", "gloo")
            for mbit in (0.0, *args.bw):
                shape_fabric(fabric, mbit)
                for n in args.sizes:
                    for method in order:
                        got = pool.run(method, n)
                        record.setdefault((w, mbit, n, method), []).append(got)
                        print(
                            f"  W={w} {_link(mbit)} n={n:,} rep {rep + 1}/{args.reps} {method}:"
                            f" {got['secs']:.2f} s, {_mbit(n, got['secs']):.1f} Mbit/s/worker,"
                            f" retx {got['retx']}, load {got['load']:.2f}",
                            flush=True,
                        )
    finally:
        if pool is not None:
            pool.close()
        fabric.close()


# ---------------------------------------------------------------- report


def _link(mbit: float) -> str:
    return f"{mbit:g} Mbit/s" if mbit else "unshaped"


def _mbit(n: int, secs: float) -> float:
    """Goodput: gradient Mbit/s per worker (4 bytes an element)."""
    return n * 32 / secs / 1e6


def _med(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _spread(runs: list[dict[str, float]]) -> str:
    s = [r["secs"] for r in runs]
    return f"{statistics.median(s):.2f} [{min(s):.2f}, {max(s):.2f}]"


def point(record: dict, w: int, mbit: float, n: int) -> dict[str, float]:
    """One point's medians and what the links and the CPU allow there."""
    gloo, switch = record[(w, mbit, n, "gloo")], record[(w, mbit, n, "switch")]
    free = record[(w, 0.0, n, "switch")]  # unshaped: the workers' own rate
    g, s = _med(gloo, "secs"), _med(switch, "secs")
    packets = int(_med(switch, "packets"))
    out = {
        "gloo_s": g,
        "switch_s": s,
        "speedup": g / s,
        "goodput": _mbit(n, s),
        "gloo_goodput": _mbit(n, g),
        "packets": packets,
        "cpu_pps": packets / _med(free, "secs"),
        "cpu_goodput": _mbit(n, _med(free, "secs")),
        # CPU per packet of a worker (its process: codec, I/O and the kernel's send path,
        # the eBPF switch's program included), unshaped; what all cores would then allow
        "us_per_packet": _med(free, "cpu") / (w * packets) * 1e6,
        "retx": sum(r["retx"] for r in switch),
        "cpu": f"{_med(gloo, 'cpu'):.2f} / {_med(switch, 'cpu'):.2f}",
        "load": statistics.median(r["load"] for r in gloo + switch),
    }
    out["cores_goodput"] = _mbit(n, packets * w * out["us_per_packet"] / 1e6 / CORES)
    if mbit:
        bound = link_bound(n, w, mbit, switch_packets=packets)
        out |= {"ideal_ratio": bound.ratio, "ideal_share": bound.switch_goodput_share}
        out |= {"share": out["goodput"] / mbit}
    return out


def _cell(point: dict[str, float], key: str, form: str) -> str:
    """point[key] in `form`, or "-" where the point has none (unshaped: no link bound)."""
    return form.format(point[key]) if key in point else "-"


def verdicts(record: dict, worlds: list[int], rates: list[float], n: int) -> list[str]:
    """Per W and rate: the speed-up and goodput share against the issue's targets."""
    out = []
    for w in worlds:
        ratio_target, share_target = TARGETS.get(w, (1.5, 0.8))
        for mbit in rates:
            p = point(record, w, mbit, n)
            ok = p["speedup"] >= ratio_target and p["share"] >= share_target
            out.append(
                f"W={w} {mbit:g} Mbit/s: {p['speedup']:.2f}x gloo (>= {ratio_target}x), "
                f"goodput {p['share']:.0%} of the link (>= {share_target:.0%}): "
                f"{'MET' if ok else 'MISSED'}"
            )
    return out


def report(record: dict, args: argparse.Namespace, elapsed: float) -> tuple[list[str], str]:
    """The results' markdown and the one-line summary."""
    lines = [
        heading("Where links are the limit"),
        "",
        f"`python -m bench.shaped_links --target {args.target} --worlds "
        f"{' '.join(map(str, args.asked_worlds))} --bw {' '.join(f'{b:g}' for b in args.bw)} "
        f"--sizes {' '.join(map(str, args.sizes))} --reps {args.reps} --pool {args.pool}`; "
        f"ran in {elapsed:.0f} s, "
        f"{NAMES[args.target]} switch. Plot: {args.name}.png.",
        "",
        "Dense fixed point (32 bits, exact) of one float32 gradient of n elements per worker "
        "through the switch, against gloo's all_reduce (ring) of the same tensor; each rank "
        "one process in its host's namespace (a pool of `--pool` slots: packets in flight "
        "per worker), both methods over the same links (every host link shaped at both "
        "ends with htb, as Mininet's TCLink). Seconds: the slowest "
        "rank's step, median [min, max] over repetitions (every repetition ran every rate "
        "and both methods, alternating order). Goodput: gradient Mbit/s per worker "
        "(4n bytes / step). Ideal: what the links allow, the switch sending the packets it "
        f"really sent (one copy of the gradient plus the exponent phase; "
        f"{switch_header_bytes()} bytes of headers per {args.cells * 4}-byte payload, "
        f"{switch_wire_share():.1%} of a frame is gradient), the ring 2(W-1)/W of the "
        "gradient in full TCP segments (1448 of 1514 bytes). CPU bound: the same switch "
        "step unshaped, the workers' packet rate on this machine as loaded, and the goodput "
        "it allows; CPU us/packet: the workers' processes' CPU (user + system: codec, I/O, "
        "the kernel's send path with the eBPF program) per packet a worker sent, unshaped, "
        f"and the goodput per worker if all {CORES} cores ran the W workers and nothing else; "
        "CPU s: user + system seconds of all ranks' processes in one step, median. Load: "
        "the 1-minute load average (median over the point's steps).",
        "",
        "| W | link | n | gloo s | switch s | switch / gloo | ideal ratio | switch goodput "
        "Mbit/s (share) | ideal share | CPU bound pkt/s/worker (Mbit/s) | CPU us/packet "
        "(Mbit/s on all cores) | CPU s gloo / switch | gloo Mbit/s | retx | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in args.worlds:
        for mbit in (0.0, *args.bw):
            for n in args.sizes:
                p = point(record, w, mbit, n)
                share = f" ({p['share']:.0%})" if mbit else ""
                lines.append(
                    f"| {w} | {_link(mbit)} | {n:,} | {_spread(record[(w, mbit, n, 'gloo')])} | "
                    f"{_spread(record[(w, mbit, n, 'switch')])} | {p['speedup']:.2f}x | "
                    f"{_cell(p, 'ideal_ratio', '{:.2f}x')} | {p['goodput']:.1f}{share} | "
                    f"{_cell(p, 'ideal_share', '{:.0%}')} | {p['cpu_pps']:,.0f} "
                    f"({p['cpu_goodput']:.0f}) | {p['us_per_packet']:.1f} "
                    f"({p['cores_goodput']:.0f}) | {p['cpu']} | {p['gloo_goodput']:.1f} | "
                    f"{p['retx']} | "
                    f"{p['load']:.2f} |"
                )
    lines += ["", "Targets (largest n):", ""]
    verdict = verdicts(record, args.worlds, args.bw, max(args.sizes))
    lines += [f"- {v}" for v in verdict] + [""]
    return lines, "shaped links, " + NAMES[args.target] + ": " + "; ".join(verdict)


def plot(record: dict, args: argparse.Namespace, path: Path) -> None:
    """Goodput per worker against the link rate, per W: measured and ideal."""
    plt = pyplot()
    n = max(args.sizes)
    fig, axes = plt.subplots(1, len(args.worlds), figsize=(5 * len(args.worlds), 3.8))
    for ax, w in zip(np.atleast_1d(axes), args.worlds, strict=True):
        pts = [point(record, w, m, n) for m in args.bw]
        ax.plot(args.bw, [p["goodput"] for p in pts], "bo-", label="switch, measured")
        ax.plot(args.bw, [p["gloo_goodput"] for p in pts], "ks-", label="gloo, measured")
        ax.plot(args.bw, [p["ideal_share"] * m for p, m in zip(pts, args.bw, strict=True)],
                "b:", label="switch, ideal")  # fmt: skip
        ring = [p["ideal_share"] * m / p["ideal_ratio"] for p, m in zip(pts, args.bw, strict=True)]
        ax.plot(args.bw, ring, "k:", label="ring, ideal")
        ax.axhline(pts[0]["cpu_goodput"], color="r", ls="--", label="switch unshaped (CPU)")
        ax.axhline(pts[0]["cores_goodput"], color="g", ls="--", label="CPU, all cores ours")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link rate (Mbit/s)")
        ax.set_ylabel("goodput, gradient Mbit/s per worker")
        ax.set_title(f"{NAMES[args.target]}, W={w}, n={n:,}")
        ax.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from homagg.wire.constants import CELLS_PER_PKT

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=sorted(NAMES), default="ebpf", help="switch (eBPF)")
    p.add_argument("--worlds", type=int, nargs="+", default=[4, 8], help="W (default 4 8)")
    p.add_argument(
        "--bw", type=float, nargs="+", default=[100.0, 1000.0],
        help="link rates in Mbit/s, htb on both ends of every link (default 100 1000)",
    )  # fmt: skip
    p.add_argument(
        "--sizes", type=int, nargs="+", default=[4_000_000],
        help="gradient elements per worker (default 4,000,000: 16 MB)",
    )  # fmt: skip
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument(
        "--pool", type=int, default=POOL_SIZE,
        help=f"the job's pool: packets a worker keeps in flight (default {POOL_SIZE}; the "
        "window must cover the link's rate times a round trip, scheduling included)",
    )  # fmt: skip
    p.add_argument("--name", default="shaped_links", help="results file stem")
    args = p.parse_args(argv)
    if any(b <= 0 for b in args.bw) or any(n < 1 for n in args.sizes) or args.reps < 1:
        p.error("--bw, --sizes and --reps must be positive")
    if not 1 <= args.pool <= MAX_POOL:
        p.error(f"--pool must be within 1..{MAX_POOL}")
    args.cells = CELLS_PER_PKT
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from homagg.lab.namespace import have_privileges

    if not have_privileges():
        print("bench.shaped_links needs root (network namespaces)", file=sys.stderr)
        return 1
    start = time.perf_counter()
    record: dict = {}
    failed = []
    for w in args.worlds:
        print(f"shaped links: {NAMES[args.target]}, W = {w}", flush=True)
        try:
            measure_world(args, w, record)
        except RuntimeError as exc:  # a W that failed leaves the tables, listed at the end
            failed.append(f"W={w}: {exc}")
            print(f"  FAILED: W={w}: {exc}", flush=True)
            for key in [k for k in record if k[0] == w]:
                del record[key]
    args.asked_worlds = args.worlds
    args.worlds = [w for w in args.worlds if any(k[0] == w for k in record)]
    if not args.worlds:
        print("bench.shaped_links: every W failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    lines, summary = report(record, args, time.perf_counter() - start)
    plot(record, args, plot_path(f"{args.name}.png"))
    publish(args.name, lines, summary, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
