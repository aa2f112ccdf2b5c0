"""Switch packet rate, reference switch vs BMv2 (and the optimized BMv2 build, target
bmv2-opt, when HOMAGG_BMV2_OPT or --bmv2-opt names its prefix) vs the eBPF target, side
by side in one run. The eBPF target runs as it does by default (ebpf: the TC program
alone), and as variants with its XDP stage in front: ebpf-xdp (native XDP) and
ebpf-generic (generic XDP), set by HOMAGG_EBPF_XDP for their switch processes.

Each target runs in its own fabric (4 hosts in namespaces); batches of a full pool
(32 slots x 4 workers) are sent as fast as the hosts can, then every result is awaited.
Targets alternate batch by batch so that a noisy neighbour hits both alike; the table
gives the median and spread of contributions absorbed per second, per cells-per-packet
setting (settings other than the committed program's are compiled on the fly:
they need p4c) and per op (`--ops ADD ADD16 ADD8`: values/s counts the lanes, 2 or 4 per
cell for the lane ops). `--senders python c:1 c:4`: who sends, a row each: this Python
process, or N processes of the C sender (bench/rawsend.c, sendmmsg, built with cc at run
time), so that the senders need not be the limit; the report says where the CPU went
(senders, switch process, the eBPF program's run time). Writes
bench/results/switch_rate.md and switch_rate.png (switch_rate_ops.* when lane ops are
measured; --name sets the stem).

    python -m bench.switch_rate [--cells 64 128 256] [--ops ADD ADD16 ADD8] [--reps 7]
        [--targets refswitch bmv2 bmv2-opt ebpf ebpf-xdp ebpf-generic] [--senders python c:4]
        [--bmv2-opt PREFIX]
        [--name switch_rate]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import rawsend
from bench.publish import heading, plot_path, publish, pyplot
from homagg.environment import BMV2_OPT_ENV, CELLS_PER_PKT_ENV, EBPF_XDP_ENV
from homagg.lab import REPO_ROOT
from homagg.lab.switch_process import TARGETS, available_targets, target_problem
from homagg.wire.constants import CELL_BITS, LANE_BITS_OF_OP, Op

EBPF_VARIANTS = {"ebpf-xdp": "native", "ebpf-generic": "generic"}  # -> HOMAGG_EBPF_XDP
BENCH_TARGETS = (*TARGETS, *EBPF_VARIANTS)
PY_BATCHES = 4  # full pools per measurement with the Python sender
C_BATCHES = 64  # ... with the C sender: a window long enough to time at its rate


def _frames(job, pool_size: int, batches: int, first_chunk: int, op: int) -> list[list[bytes]]:
    """Per batch, the frames of a full pool from every rank, rank by rank."""
    import numpy as np

    from homagg.lab.aggjob import random_cells

    rng = np.random.default_rng(first_chunk)
    cells = [random_cells(rng) for _ in range(job.world_size)]
    out = []
    for b in range(batches):
        chunks = range(first_chunk + b * pool_size, first_chunk + (b + 1) * pool_size)
        out.append(
            [
                job.frame(
                    r, cells[r], slot=k % pool_size, shadow=(k // pool_size) % 2, chunk=k, op=op
                )
                for r in range(job.world_size)
                for k in chunks
            ]
        )
    return out


def _send_python(job, pool_size: int, batches: list[list[bytes]]) -> tuple[float, int, float]:
    """This process sends each batch from the hosts' raw sockets and awaits its results:
    wall seconds, results missing, CPU seconds of this process."""
    missing, elapsed, cpu = 0, 0.0, time.process_time()
    for frames in batches:
        start = time.perf_counter()
        for k in range(pool_size):  # chunk by chunk, every rank in turn
            for r in range(job.world_size):
                job.hosts[r].raw.send(frames[r * pool_size + k])
        for r in range(job.world_size):
            missing += pool_size - len(job.hosts[r].raw.receive(2.0, count=pool_size))
        elapsed += time.perf_counter() - start
    return elapsed, missing, time.process_time() - cpu


def _send_c(job, pool_size: int, per_rank: dict, procs: int) -> tuple[float, int, float]:
    """The C sender's run, the hosts' Python raw sockets closed meanwhile (each would get
    a copy of every frame sent and received: kernel time that is neither sender nor
    switch) and opened again after."""
    from homagg.lab.namespace import in_namespace
    from homagg.lab.rawsock import RawPort

    for h in job.hosts:
        h.raw.close()
    try:
        return rawsend.send_c(per_rank, job.hosts, pool_size, procs)
    finally:
        for h in job.hosts:
            with in_namespace(h.namespace):
                h.raw = RawPort(h.iface)


def _measure(job, pool_size: int, first_chunk: int, op: int, sender: str, progs: set[int]) -> dict:
    """One measurement of `job`'s switch by `sender` ("python", or "c:N": N C processes):
    contributions per second over full pools (sending and awaiting only), results missing,
    and the CPU the senders, the switch process and (ebpf) the program used meanwhile."""
    kind, _, procs = sender.partition(":")
    batches = _frames(
        job, pool_size, PY_BATCHES if kind == "python" else C_BATCHES, first_chunk, op
    )
    pid = job.fabric.switch.proc.pid
    switch_cpu, (bpf_ns, bpf_cnt) = rawsend.process_cpu(pid), rawsend.bpf_program_stats(progs)
    if kind == "python":
        wall, missing, sender_cpu = _send_python(job, pool_size, batches)
    else:
        per_rank = {
            r: [f for b in batches for f in b[r * pool_size : (r + 1) * pool_size]]
            for r in range(job.world_size)
        }
        wall, missing, sender_cpu = _send_c(job, pool_size, per_rank, int(procs))
    bpf = rawsend.bpf_program_stats(progs)
    packets = len(batches) * pool_size * job.world_size
    return {
        "rate": packets / wall,
        "missing": missing,
        "packets": packets,
        "wall": wall,
        "sender_cpu": sender_cpu,
        "switch_cpu": rawsend.process_cpu(pid) - switch_cpu,
        "bpf_ns": bpf[0] - bpf_ns,
        "bpf_cnt": bpf[1] - bpf_cnt,
    }


def run_child(
    cells: int,
    reps: int,
    artifacts: tuple[Path, Path] | None,
    ops: list[str],
    targets: list[str],
    senders: list[str],
) -> list[dict]:
    """Measure the targets, ops and senders with the current HOMAGG_CELLS_PER_PKT; they
    alternate measurement by measurement, one row per op and sender."""
    from homagg.lab.aggjob import Job

    fabrics, progs = {}, {}
    try:
        for t in targets:  # the BPF programs that appear with a fabric are its switch's
            before = rawsend.bpf_program_ids()
            fabrics[t] = _fabric(t, artifacts)
            progs[t] = rawsend.bpf_program_ids() - before
        jobs = {t: Job(f, f.hosts, pool_size=32) for t, f in fabrics.items()}
        keys = [(o, s) for o in ops for s in senders]
        got: dict = {k: {t: [] for t in targets} for k in keys}
        chunk = 0
        with rawsend.BpfStats():
            for t in targets:
                for s in senders:
                    chunk += 1 << 14
                    _measure(jobs[t], 32, chunk, Op.ADD, s, progs[t])  # warm-up
            for rep in range(reps):
                for o, s in keys:
                    chunk += 1 << 14
                    for t in targets:
                        got[(o, s)][t].append(_measure(jobs[t], 32, chunk, Op[o], s, progs[t]))
                    print(
                        f"  cells {cells} {o} {s} rep {rep + 1}/{reps}: "
                        + ", ".join(f"{t} {got[(o, s)][t][-1]['rate']:.0f}/s" for t in targets),
                        flush=True,
                    )
        return [_row(cells, o, s, got[(o, s)]) for o, s in keys]
    finally:
        for f in fabrics.values():
            f.close()


def _fabric(target: str, artifacts: tuple[Path, Path] | None):
    """A 4-host fabric of `target`; an eBPF variant is the ebpf target with its
    HOMAGG_EBPF_XDP, set while its switch process starts."""
    from homagg.lab.fabric import Fabric

    kind, mode = ("ebpf", EBPF_VARIANTS[target]) if target in EBPF_VARIANTS else (target, None)
    saved = os.environ.get(EBPF_XDP_ENV)
    if mode is not None:
        os.environ[EBPF_XDP_ENV] = mode
    try:
        return Fabric(kind, 4, artifacts=artifacts) if artifacts else Fabric(kind, 4)
    finally:
        if saved is None:
            os.environ.pop(EBPF_XDP_ENV, None)
        else:
            os.environ[EBPF_XDP_ENV] = saved


def _row(cells: int, op: str, sender: str, got: dict[str, list[dict]]) -> dict:
    """A report row from the measurements of each target: rates, missing, CPU sums."""
    sums = ("packets", "wall", "sender_cpu", "switch_cpu", "bpf_ns", "bpf_cnt")
    return {
        "cells": cells,
        "op": op,
        "sender": sender,
        "rates": {t: [m["rate"] for m in ms] for t, ms in got.items()},
        "missing": {t: sum(m["missing"] for m in ms) for t, ms in got.items()},
        "cpu": {t: {k: sum(m[k] for m in ms) for k in sums} for t, ms in got.items()},
    }


RATIOS = (
    ("refswitch", "bmv2"),
    ("bmv2-opt", "bmv2"),
    ("ebpf", "refswitch"),
    ("ebpf", "bmv2-opt"),
    ("ebpf", "bmv2"),
    ("ebpf-xdp", "refswitch"),
    ("ebpf-generic", "refswitch"),
    ("ebpf-xdp", "ebpf"),
)  # (numerator, denominator) of a row


def ratio_rows(row: dict) -> list[str]:
    """ "refswitch / bmv2" and "bmv2-opt / bmv2" rows: the medians' ratio, for each pair of
    targets the row measured (what the optimized build buys, what the reference switch
    does beside BMv2); the last column names the senders."""
    out = []
    senders = sender_label(row.get("sender", "python"))
    for a, b in RATIOS:
        if a in row["rates"] and b in row["rates"]:
            ratio = statistics.median(row["rates"][a]) / statistics.median(row["rates"][b])
            out.append(
                f"| {row['cells']} | {row['op']} | {a} / {b} | {ratio:.2f}x | | | | {senders} |"
            )
    return out


def sender_label(sender: str) -> str:
    """ "python" -> "1 Python", "c:4" -> "4 C (sendmmsg)": who sent a row's frames."""
    kind, _, procs = sender.partition(":")
    return "1 Python" if kind == "python" else f"{procs} C (sendmmsg)"


def limit_rows(row: dict) -> list[str]:
    """Per target, where the time went: cores busy in the senders and in the switch
    process, and the eBPF programs' own run time (kernel BPF statistics): per contribution
    (XDP and TC runs together) and per run."""
    out = []
    for t, c in row.get("cpu", {}).items():
        prog = (
            f"{c['bpf_ns'] / c['packets'] / 1e3:.2f} us ({c['bpf_cnt'] / c['packets']:.2f} "
            f"runs of {c['bpf_ns'] / c['bpf_cnt'] / 1e3:.2f} us), "
            f"{c['bpf_ns'] / 1e9 / c['wall']:.2f}"
            if c["bpf_cnt"]
            else "-"
        )
        out.append(
            f"| {row['cells']} | {row['op']} | {sender_label(row['sender'])} | {t} | "
            f"{statistics.median(row['rates'][t]):,.0f} | {c['sender_cpu'] / c['wall']:.2f} "
            f"({c['sender_cpu'] / c['packets'] * 1e6:.1f} us/packet) | "
            f"{c['switch_cpu'] / c['wall']:.2f} | {prog} |"
        )
    return out


def _compile(cells: int, out: Path) -> tuple[Path, Path] | None:
    from homagg.wire.constants import CELLS_PER_PKT

    if cells == CELLS_PER_PKT:  # the committed program
        return None
    if shutil.which("p4c") is None:
        print(f"  cells {cells}: skipped (p4c is needed to build that program)")
        return "skip"  # type: ignore[return-value]
    subprocess.run(
        ["make", "--no-print-directory", "-B", "p4", f"CELLS={cells}", f"P4_BUILD={out}"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    return out / "homagg.p4info.txtpb", out / "homagg.json"


def plot(rows: list[dict], path: Path) -> None:
    """Packets/s and values/s (median, min-max bars) by cells per packet, per target and op."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = {"refswitch": "reference switch", "bmv2": "BMv2", "bmv2-opt": "BMv2 -O3"}
    names.update({"ebpf": "eBPF (TC)", "ebpf-xdp": "eBPF (XDP + TC)"})
    names["ebpf-generic"] = "eBPF (generic XDP)"
    styles = [("refswitch", "o-"), ("bmv2", "s-"), ("bmv2-opt", "^-"), ("ebpf", "D-")]
    styles += [("ebpf-xdp", "v-"), ("ebpf-generic", "x-")]
    for (t, style), sender in itertools.product(
        styles, dict.fromkeys(r.get("sender") for r in rows)
    ):
        for op in dict.fromkeys(r.get("op", "ADD") for r in rows):
            lanes = CELL_BITS // LANE_BITS_OF_OP[Op[op]]
            pts = [
                (r["cells"], r["rates"][t])
                for r in rows
                if t in r["rates"] and r.get("op", "ADD") == op and r.get("sender") == sender
            ]
            if not pts:
                continue
            for ax, per_pkt in ((axes[0], lambda c: 1), (axes[1], lambda c, n=lanes: c * n)):
                xs = [c for c, _ in pts]
                med = [statistics.median(v) * per_pkt(c) for c, v in pts]
                err = [
                    [m - min(v) * per_pkt(c) for (c, v), m in zip(pts, med)],
                    [max(v) * per_pkt(c) - m for (c, v), m in zip(pts, med)],
                ]
                ax.errorbar(
                    xs,
                    med,
                    yerr=err,
                    fmt=style,
                    capsize=3,
                    label=f"{names[t]} {op}" + (f", {sender_label(sender)}" if sender else ""),
                )
    for ax, label in zip(axes, ("packets/s", "values/s")):
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, nargs="+", default=[64, 128, 256], choices=[64, 128, 256])
    p.add_argument(
        "--ops",
        nargs="+",
        default=["ADD"],
        choices=["ADD", "ADD16", "ADD8"],
        help="adding ops to measure (lane ops carry 2 or 4 values per cell)",
    )
    p.add_argument("--reps", type=int, default=7)
    p.add_argument(
        "--targets",
        nargs="+",
        choices=BENCH_TARGETS,
        default=None,
        help="switches to compare, alternating (default: every one available here, the "
        "eBPF target also with its XDP stage: ebpf-xdp)",
    )
    p.add_argument(
        "--bmv2-opt",
        type=Path,
        default=None,
        metavar="PREFIX",
        help=f"the optimized BMv2 build's prefix: target bmv2-opt (default ${BMV2_OPT_ENV})",
    )
    p.add_argument(
        "--senders",
        nargs="+",
        default=["python"],
        metavar="SENDER",
        help="who sends, each a row: python (this process) or c:N (N processes of the C "
        "sender, bench/rawsend.c, sendmmsg; built with cc at run time)",
    )
    p.add_argument("--name", default="", help="results file stem (default switch_rate[_ops])")
    p.add_argument("--child", type=str, help=argparse.SUPPRESS)
    return p


def measure(args: argparse.Namespace, targets: list[str]) -> list[dict]:
    """One child process per cells-per-packet setting (its program compiled when it is not
    the committed one); the rows they measured."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cells in args.cells:
            artifacts = _compile(cells, Path(tmp) / str(cells))
            if artifacts == "skip":
                continue
            env = {**os.environ, CELLS_PER_PKT_ENV: str(cells)}
            child = ",".join(map(str, artifacts)) if artifacts else "-"
            cmd = [sys.executable, "-m", "bench.switch_rate", "--reps", str(args.reps)]
            cmd += ["--ops", *args.ops, "--targets", *targets, "--senders", *args.senders]
            cmd += ["--child", child]
            proc = subprocess.run(
                cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True
            )
            for line in proc.stdout.splitlines():
                if line.startswith("RESULT "):
                    rows.extend(json.loads(line[7:]))
                else:
                    print(line)
    return rows


def report(rows: list[dict], targets: list[str], name: str) -> list[str]:
    """The markdown table: per row and target the rates, then the ratio rows."""
    opt = " (bmv2-opt: the optimized BMv2 build, docs/bmv2.md)" if "bmv2-opt" in targets else ""
    lines = [
        heading("Switch packet rate"),
        "",
        "Contributions absorbed per second (median of reps, [min, max]); 4 workers, "
        f"pool size 32; targets {', '.join(targets)} alternate batch by batch{opt}.",
        "",
        "| cells/packet | op | target | packets/s | cells/s | values/s | missing results "
        "| senders |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lanes = CELL_BITS // LANE_BITS_OF_OP[Op[row["op"]]]
        for t, rates in row["rates"].items():
            med = statistics.median(rates)
            lines.append(
                f"| {row['cells']} | {row['op']} | {t} | {med:,.0f} [{min(rates):,.0f}, "
                f"{max(rates):,.0f}] | {med * row['cells']:,.0f} | "
                f"{med * row['cells'] * lanes:,.0f} | {row['missing'][t]} | "
                f"{sender_label(row.get('sender', 'python'))} |"
            )
        lines += ratio_rows(row)
    lines += [
        "",
        f"Where the time went ({os.cpu_count()} cores; summed over the reps): cores busy in "
        "the senders (user + system: on a veth the kernel's path to the switch, and the eBPF "
        "program itself, run in the sending process's system time) and in the switch "
        "process; the eBPF programs' run time per contribution (the XDP stage's run and, for "
        "the contributions it passes on, the TC program's, clones to the workers included), "
        "the runs per contribution and the time of one, and the cores they kept busy, from "
        "`bpftool prog show` run_time_ns / run_cnt with kernel.bpf_stats_enabled = 1.",
        "",
        "| cells/packet | op | senders | target | packets/s | sender cores (CPU per packet) "
        "| switch process cores | eBPF programs per contribution, cores |",
        "|---:|---|---|---|---:|---|---:|---|",
    ]
    for row in rows:
        lines += limit_rows(row)
    return [*lines, "", f"![switch packet rate]({name}.png)"]


def _problem(target: str) -> str:
    """Why `target` (or an eBPF variant) cannot run here ("" when it can)."""
    return target_problem("ebpf" if target in EBPF_VARIANTS else target)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench/results/switch_rate.md."""
    p = _parser()
    args = p.parse_args(argv)
    if args.bmv2_opt is not None:
        os.environ[BMV2_OPT_ENV] = str(args.bmv2_opt)  # the child and its switches read it
    targets = args.targets or available_targets()
    if not args.targets and "ebpf" in targets:
        targets.append("ebpf-xdp")
    problems = [f"{t}: {_problem(t)}" for t in targets if _problem(t)]
    if problems:
        p.error("; ".join(problems))
    if args.child:
        artifacts = None
        if args.child != "-":
            p4info, bmv2_json = args.child.split(",")  # written by the parent: two paths
            artifacts = (Path(p4info), Path(bmv2_json))
        cells = int(os.environ[CELLS_PER_PKT_ENV])
        print(
            "RESULT "
            + json.dumps(run_child(cells, args.reps, artifacts, args.ops, targets, args.senders))
        )
        return 0
    rows = measure(args, targets)
    # Lane ops go to their own report, so the cells-per-packet one stays as it was.
    name = args.name or ("switch_rate" if args.ops == ["ADD"] else "switch_rate_ops")
    plot(rows, plot_path(f"{name}.png"))
    publish(name, report(rows, targets, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
