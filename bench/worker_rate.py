"""Worker packet rate per transport I/O path, side by side in one run: dense fixed point
(FixedPoint) through the switch, one worker and W = 4, the batched path (sendmmsg /
recvmmsg, batches parsed with numpy) against the per-datagram reference path
(homagg/worker/transport/io_path.py).

The workers are bench/aggregation.py's (`SwitchGroup`: threads of this process, one
namespace and UDP socket each, pool size 32); each repetition runs every W and path in
turn on the same job, so the paths alternate and share the machine's noise. Every step's
sums are checked: equal on every worker, and bit for bit equal to the other path's. The
table gives packets sent per second per worker (first sends and resends: what the worker
put on its link) and million elements per second per worker, median [min, max] over
repetitions, and the batched path's ratio to the reference's (ratio of medians).
`--profile` adds, per path and target, where one worker's time went (cProfile of one
step at W = 1, the functions with the most own time).

    python -m bench.worker_rate [--n 2000000] [--reps 5] [--targets ebpf refswitch]
        [--world-sizes 1 4] [--profile] [--name worker_rate]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from bench import rawsend
from bench.aggregation import NAMES, POOL_SIZE, SwitchGroup
from bench.publish import heading, publish
from homagg.wire.constants import CELLS_PER_PKT, Flag
from homagg.wire.header import header_view
from homagg.worker.transport.io_path import BATCHED, IO_PATHS, PYTHON

TARGET_RATE = 100_000  # packets/s per worker (issue 30)


def measure(target: str, args, record: dict, profiles: dict) -> None:
    """Alternate the paths at every W on `target`, args.reps times, with the CPU this
    process (workers: Python and their system calls, in which the kernel also runs the
    veth links and, on eBPF, the switch) and the eBPF program used meanwhile."""
    from homagg.lab.fabric import Fabric
    from homagg.worker.codecs import FixedPoint

    rng = np.random.default_rng(0)
    fabrics, groups, progs = {}, {}, {}
    try:
        for w in args.world_sizes:
            before = rawsend.bpf_program_ids()  # those that appear are this fabric's switch's
            fabrics[w] = Fabric(target, w)
            progs[w] = rawsend.bpf_program_ids() - before
            for h in fabrics[w].hosts:
                h.enable_ip_stack()
            groups[w] = SwitchGroup(fabrics[w], w, 0.02)
        inputs = {
            w: [rng.standard_normal(args.n).astype(np.float32) for _ in range(w)]
            for w in args.world_sizes
        }
        codecs = {w: [FixedPoint(w) for _ in range(w)] for w in args.world_sizes}
        for w in args.world_sizes:  # warm-up
            for path in IO_PATHS:
                _step(groups[w], codecs[w], [x[:100_000] for x in inputs[w]], path)
        for rep in range(args.reps):
            for w in args.world_sizes:
                sums = {}
                for path in (BATCHED, PYTHON) if rep % 2 else (PYTHON, BATCHED):
                    cpu0, bpf0 = os.times(), rawsend.bpf_program_stats(progs[w])
                    secs, sent, retx, out = _step(groups[w], codecs[w], inputs[w], path)
                    cpu, bpf = os.times(), rawsend.bpf_program_stats(progs[w])
                    sums[path] = out
                    rec = record.setdefault(
                        (target, w, path),
                        {"secs": [], "pps": [], "retx": 0, "sent": 0, "user": 0.0, "sys": 0.0},
                    )
                    rec["secs"].append(secs)
                    rec["pps"].append(sent / w / secs)
                    rec["retx"] += retx
                    rec["sent"] += sent
                    rec["user"] += cpu.user - cpu0.user
                    rec["sys"] += cpu.system - cpu0.system
                    rec["bpf_ns"] = rec.get("bpf_ns", 0) + bpf[0] - bpf0[0]
                    print(
                        f"  {target} rep {rep + 1}/{args.reps} W={w} {path}: {secs:.2f} s, "
                        f"{sent / w / secs:,.0f} packets/s/worker, "
                        f"{args.n / secs / 1e6:.2f} M elem/s/worker, retx {retx}",
                        flush=True,
                    )
                if not np.array_equal(sums[BATCHED], sums[PYTHON]):
                    raise RuntimeError(f"{target} W={w}: the two paths decoded different sums")
        if args.profile and 1 in groups:
            for path in IO_PATHS:
                profiles[(target, path)] = _profile(groups[1], codecs[1], inputs[1], path)
    finally:
        for g in groups.values():
            g.close()
        for f in fabrics.values():
            f.close()


def _step(group: SwitchGroup, codecs: list, xs: list, path: str):
    """One aggregation on `path`: (wall s, packets sent by all workers, retx, rank 0's sum)."""
    for t in group.transports:
        t.io_path = path
    sent0 = sum(t.stats.packets_sent for t in group.transports)
    secs, out, retx = group.step(codecs, xs)
    if any(not np.array_equal(out[0], o) for o in out[1:]):
        raise RuntimeError(f"{path}: workers decoded different sums")
    return secs, sum(t.stats.packets_sent for t in group.transports) - sent0, retx, out[0]


def _profile(group: SwitchGroup, codecs: list, xs: list, path: str) -> list[str]:
    """cProfile of one step of the one worker of `group` on `path`, in this thread, in CPU
    time (the thread's, so that waiting for a core on a loaded machine is not counted;
    system calls count the kernel's work in them): the functions with the most own time."""
    t = group.transports[0]
    t.io_path = path
    prof = cProfile.Profile(time.thread_time)
    start, cpu, sent = time.perf_counter(), time.thread_time(), t.stats.packets_sent
    prof.runcall(lambda: t.run(codecs[0].aggregate(xs[0])))
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    text = io.StringIO()
    pstats.Stats(prof, stream=text).strip_dirs().sort_stats("tottime").print_stats(12)
    body = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    start_at = next(i for i, ln in enumerate(body) if ln.lstrip().startswith("ncalls"))
    sent = t.stats.packets_sent - sent
    return [
        f"{sent:,} packets; wall {wall:.2f} s, CPU {cpu:.2f} s ({1e6 * cpu / sent:.1f} us per "
        "packet) under the profiler",
        *body[start_at:],
    ]


class EchoSwitch:
    """A one-worker switch inside this process: every contribution comes back at once as
    its result (no kernel, no network), so a worker's CPU per packet against it is the
    worker's own: the codec, packing, parsing, timers. `batched`: it takes and gives whole
    batches (send_many / recv_many) as a UDP channel does."""

    def __init__(self, batched: bool) -> None:
        self.answers: list[np.ndarray] = []
        if batched:
            self.send_many, self.recv_many = self._send_many, self._recv_many

    def _answer(self, rows: np.ndarray) -> None:
        out = np.zeros((rows.shape[0], rows.shape[1] + 1), np.uint8)  # recv_many's rows
        out[:, :-1] = rows
        header_view(out)["flags"] = int(Flag.RESULT)
        self.answers.append(out)

    def send(self, payload: bytes) -> None:
        self._answer(np.frombuffer(payload, np.uint8)[None, :])

    def recv(self, timeout: float) -> bytes | None:
        if not self.answers:
            return None
        rows = self.answers.pop(0)
        if rows.shape[0] > 1:
            self.answers.insert(0, rows[1:])
        return rows[0, :-1].tobytes()

    def close(self) -> None:
        pass

    def _send_many(self, rows: np.ndarray) -> None:
        self._answer(rows)

    def _recv_many(self, timeout: float, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.concatenate(self.answers) if self.answers else np.zeros((0, row_bytes), np.uint8)
        self.answers = []
        return rows, np.full(rows.shape[0], rows.shape[1] - 1)


def worker_cpu(n: int, reps: int) -> dict[str, float]:
    """CPU us per packet of one worker's dense fixed-point step against EchoSwitch, per
    path, and of the codec alone (its phases summed in place): the best of `reps`."""
    from homagg.worker.codecs import FixedPoint
    from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    codec, best = FixedPoint(1), dict[str, float]()
    for _ in range(reps):
        cpu = time.thread_time()
        gen = codec.aggregate(x)
        try:
            phase = next(gen)
            while True:
                phase = gen.send(np.array(phase.cells, np.int32))
        except StopIteration:
            pass
        packets = -(-n // CELLS_PER_PKT)
        best["codec alone"] = min(best.get("codec alone", 1e9), time.thread_time() - cpu)
        for path in (PYTHON, BATCHED):
            cfg = TransportConfig(job_id=1, rank=0, world_size=1, pool_size=POOL_SIZE)
            t = SwitchTransport(replace(cfg, io_path=path), EchoSwitch(path == BATCHED))
            cpu = time.thread_time()
            t.run(codec.aggregate(x))
            best[path] = min(best.get(path, 1e9), time.thread_time() - cpu)
            packets = t.stats.packets_sent
    return {k: 1e6 * v / packets for k, v in best.items()}


def _rates(values: list[float], scale: float = 1.0, fmt: str = ",.0f") -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"


def report(record: dict, profiles: dict, elapsed: float, args) -> tuple[list[str], str]:
    """The markdown lines and the one-line summary (the 100,000 packets/s target)."""
    lines = [
        heading("Worker packet rate per transport I/O path"),
        "",
        f"`python -m bench.worker_rate --n {args.n} --reps {args.reps} --targets "
        f"{' '.join(args.targets)} --world-sizes {' '.join(map(str, args.world_sizes))}"
        f"{' --profile' if args.profile else ''}`; ran in {elapsed:.0f} s.",
        "",
        "Dense fixed point (FixedPoint) of one float32 tensor of n elements per worker, "
        f"workers as threads of one process (pool size {POOL_SIZE}); per repetition every W "
        "and path in turn (the order of the paths alternates), median [min, max] over "
        "repetitions; every step's sums equal on every worker and across the two paths. "
        "Packets/s: datagrams each worker sent per second (a 1,082-byte frame each); "
        "`batched`: sendmmsg / recvmmsg, batches parsed with numpy, timers per batch; "
        "`python`: one datagram per system call (the reference path).",
        "",
        "CPU: this process's user and system CPU per packet sent (all workers' threads; "
        "system time holds the kernel's UDP and veth path, and on eBPF the switch program "
        "run in the sender's context), and the eBPF program's own run time per packet "
        "(kernel BPF statistics; contributions and results both pass it).",
        "",
        "| target | W | path | packets/s/worker | M elem/s/worker | vs python | "
        "CPU us/packet user + sys | eBPF us/packet | retx |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    best = 0.0
    for target in args.targets:
        for w in args.world_sizes:
            base = statistics.median(record[(target, w, PYTHON)]["pps"])
            for path in (PYTHON, BATCHED):
                rec = record[(target, w, path)]
                med = statistics.median(rec["pps"])
                best = max(best, med) if path == BATCHED else best
                elem = [args.n / s / 1e6 for s in rec["secs"]]
                user, sys_ = (1e6 * rec[k] / rec["sent"] for k in ("user", "sys"))
                bpf = f"{rec['bpf_ns'] / 1e3 / rec['sent']:.1f}" if rec["bpf_ns"] else "-"
                lines.append(
                    f"| {NAMES[target]} | {w} | {path} | {_rates(rec['pps'])} | "
                    f"{_rates(elem, fmt='.2f')} | {med / base:.2f}x | "
                    f"{user:.1f} + {sys_:.1f} | {bpf} | {rec['retx']} |"
                )
    lines.append("")
    if "cpu" in record:
        cpu = record["cpu"]
        lines += [
            "Without a switch (one worker against a switch inside the process that answers "
            "every datagram at once: no kernel, no network), CPU us per packet of one "
            "dense fixed-point step, best of the repetitions: what the worker itself costs.",
            "",
            "| codec alone | python path (codec included) | batched path (codec included) |",
            "|---:|---:|---:|",
            f"| {cpu['codec alone']:.1f} | {cpu[PYTHON]:.1f} | {cpu[BATCHED]:.1f} |",
            "",
        ]
    for (target, path), prof in profiles.items():
        lines += [f"### Profile: {NAMES[target]}, W = 1, {path}", "", "```", *prof, "```", ""]
    ratios = ", ".join(
        f"{NAMES[t]} W={w} "
        f"{statistics.median(record[(t, w, BATCHED)]['pps']) / statistics.median(record[(t, w, PYTHON)]['pps']):.1f}x"  # noqa: E501
        for t in args.targets
        for w in args.world_sizes
    )
    met = "MET" if best >= TARGET_RATE else "MISSED"
    summary = (
        f"worker packet rate, batched vs per-datagram path: {ratios}; best batched "
        f"{best:,.0f} packets/s/worker (target >= {TARGET_RATE:,}: {met})"
    )
    lines += [f"Summary: {summary}.", ""]
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2_000_000, help="elements per worker (default 2M)")
    p.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    p.add_argument(
        "--targets",
        nargs="+",
        choices=["refswitch", "ebpf"],
        default=None,
        help="switch targets, in turn (default: ebpf where available, and refswitch)",
    )
    p.add_argument(
        "--world-sizes", nargs="+", type=int, default=[1, 4], help="W values (default 1 4)"
    )
    p.add_argument("--profile", action="store_true", help="add a cProfile of one W = 1 step")
    p.add_argument("--name", default="worker_rate", help="results file stem")
    args = p.parse_args(argv)
    from homagg.lab.namespace import have_privileges
    from homagg.lab.switch_process import ebpf_problem

    if not have_privileges():
        print("bench.worker_rate needs root (network namespaces)", file=sys.stderr)
        return 1
    args.targets = args.targets or ([] if ebpf_problem() else ["ebpf"]) + ["refswitch"]
    start = time.perf_counter()
    record: dict = {}
    profiles: dict = {}
    record["cpu"] = worker_cpu(args.n, args.reps)
    with rawsend.BpfStats():
        for target in args.targets:
            print(f"worker rate: {NAMES[target]}, n = {args.n:,}, {args.reps} reps", flush=True)
            measure(target, args, record, profiles)
    lines, summary = report(record, profiles, time.perf_counter() - start, args)
    publish(args.name, lines, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
