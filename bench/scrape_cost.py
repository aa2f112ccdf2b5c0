"""What scraping the metrics costs a switch: packets/s with and without scraping every
`--interval` seconds, side by side in one run.

A scrape is what a monitoring stack with the controller's metrics on causes: a GET of the
switch process's own endpoint (--metrics-port, homagg/refswitch/metrics.py) and the
controller's read of the switch's P4Runtime counters (homagg.control.counters.read_counters,
what its metrics poller runs every metrics_interval). Per target, a fabric of 4 hosts and a
job of pool 32 (bench.switch_rate's measurement: full pools sent as fast as the senders can,
every result awaited); "off" and "on" alternate measurement by measurement, each measurement
`--window` seconds of sending. Scrapes run on their own clock, as a scraper's would, so the
measured windows see their cost in proportion. Writes bench/results/scrape_cost.md.

    python -m bench.scrape_cost [--targets refswitch ebpf] [--reps 5] [--window 3]
        [--interval 1] [--senders c:1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import urllib.request

from bench import rawsend
from bench.publish import heading, publish
from bench.switch_rate import _measure, sender_label
from homagg.control.counters import read_counters
from homagg.lab.namespace import in_namespace
from homagg.lab.switch_process import available_targets, target_problem
from homagg.wire.constants import Op

METRICS_PORT = 9464  # on the loopback of the switch's own namespace
TARGETS = ("refswitch", "ebpf")  # the switch processes that serve metrics of their own
PARTS = {
    "http": "a GET of the switch process's /metrics",
    "p4rt": "a read of its P4Runtime counters (what the controller's metrics poller reads)",
}


class Scraper:
    """Scrapes a fabric's switch every `interval` seconds while `on` is set: the switch's
    endpoint from its namespace, then its counters over the fabric's P4Runtime session."""

    def __init__(self, fabric, interval: float, parts: tuple[str, ...] = ("http", "p4rt")) -> None:
        self.fabric, self.interval, self.parts = fabric, interval, parts
        self.on = threading.Event()
        self.done = threading.Event()
        self.http: list[float] = []  # seconds per GET /metrics
        self.p4rt: list[float] = []  # seconds per counter read
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def get(self) -> None:
        """One GET of the switch's /metrics (from a thread in the switch's namespace)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as r:
            r.read()

    def read(self) -> None:
        """One read of the switch's counters, as the controller's metrics poller makes it."""
        read_counters(self.fabric.conn, "s1", {})

    def _run(self) -> None:
        with in_namespace(self.fabric.switch_namespace):  # this thread's sockets live there
            while not self.done.wait(self.interval):
                if not self.on.is_set():
                    continue
                try:
                    start = time.perf_counter()
                    if "http" in self.parts:
                        self.get()
                        self.http.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    if "p4rt" in self.parts:
                        self.read()
                        self.p4rt.append(time.perf_counter() - start)
                except Exception as exc:  # reported, never hidden
                    self.failures.append(str(exc))

    def cpu_per_scrape(self, count: int = 50) -> tuple[float, float]:
        """CPU seconds the switch process spends per GET and per counter read, without
        traffic: `count` of each back to back, less what it spends idle meanwhile."""
        pid = self.fabric.switch.proc.pid
        start, idle = rawsend.process_cpu(pid), time.perf_counter()
        time.sleep(2.0)
        idle_rate = (rawsend.process_cpu(pid) - start) / (time.perf_counter() - idle)
        out = []
        for call in (self.get, self.read):
            cpu, wall = rawsend.process_cpu(pid), time.perf_counter()
            with in_namespace(self.fabric.switch_namespace):
                for _ in range(count):
                    call()
            spent = rawsend.process_cpu(pid) - cpu - idle_rate * (time.perf_counter() - wall)
            out.append(max(0.0, spent) / count)
        return out[0], out[1]

    def close(self) -> None:
        """Stop scraping."""
        self.done.set()
        self._thread.join(10)


def _window(job, sender: str, progs: set[int], seconds: float, chunk: int) -> tuple[float, int]:
    """Measurements back to back until `seconds` of sending: packets/s over them, and the
    chunk number to go on from."""
    packets, wall = 0, 0.0
    while wall < seconds:
        chunk += 1 << 14
        got = _measure(job, 32, chunk, Op.ADD, sender, progs)
        packets, wall = packets + got["packets"], wall + got["wall"]
    return packets / wall, chunk


def run(
    targets: list[str], reps: int, window: float, interval: float, sender: str, parts: list[str]
) -> dict:
    """Per target the rates off and on, and the scrapes' durations."""
    from homagg.lab.aggjob import Job
    from homagg.lab.fabric import Fabric

    fabrics, scrapers, jobs, progs = {}, {}, {}, {}
    try:
        for t in targets:
            before = rawsend.bpf_program_ids()
            fabrics[t] = Fabric(t, 4, metrics_port=METRICS_PORT)
            progs[t] = rawsend.bpf_program_ids() - before
            jobs[t] = Job(fabrics[t], fabrics[t].hosts, pool_size=32)
            scrapers[t] = Scraper(fabrics[t], interval, tuple(parts))
        rates: dict = {t: {"off": [], "on": []} for t in targets}
        chunk = 0
        for t in targets:  # warm-up
            _, chunk = _window(jobs[t], sender, progs[t], 0.2, chunk)
        for rep in range(reps):
            for mode in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                for t in targets:
                    scraper = scrapers[t]
                    scraper.on.set() if mode == "on" else scraper.on.clear()
                    rate, chunk = _window(jobs[t], sender, progs[t], window, chunk)
                    rates[t][mode].append(rate)
                    scraper.on.clear()
            print(
                f"  rep {rep + 1}/{reps}: "
                + ", ".join(
                    f"{t} off {rates[t]['off'][-1]:,.0f}/s on {rates[t]['on'][-1]:,.0f}/s"
                    for t in targets
                ),
                flush=True,
            )
        cpu = {t: s.cpu_per_scrape() for t, s in scrapers.items()}
        return {
            t: {**rates[t], "http": s.http, "p4rt": s.p4rt, "failures": s.failures, "cpu": cpu[t]}
            for t, s in scrapers.items()
        }
    finally:
        for s in scrapers.values():
            s.close()
        for f in fabrics.values():
            f.close()


def report(got: dict, args: argparse.Namespace) -> list[str]:
    """The markdown table: per target the median rates off and on, their ratio, the scrapes."""
    lines = [
        heading("What a metrics scrape costs the switch"),
        "",
        f"Contributions absorbed per second (median of {args.reps} windows of {args.window:g} s "
        f"[min, max]), 4 workers, pool size 32, senders {sender_label(args.sender)}; "
        f"scraping: every {args.interval:g} s {' and '.join(PARTS[x] for x in args.scrape)}; "
        "off and on alternate window by window. `python -m bench.scrape_cost "
        f"--targets {' '.join(got)} --reps {args.reps} --window {args.window:g} "
        f"--interval {args.interval:g} --senders {args.sender} --scrape {' '.join(args.scrape)}`",
        "",
        "| target | packets/s, no scraping | packets/s, scraping | on / off (paired) | scrapes | "
        "GET /metrics (median) | counter read (median) | switch CPU per GET, per read | "
        f"switch CPU at one scrape per {args.interval:g} s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t, g in got.items():
        off, on = g["off"], g["on"]
        lines.append(
            f"| {t} | {statistics.median(off):,.0f} [{min(off):,.0f}, {max(off):,.0f}] | "
            f"{statistics.median(on):,.0f} [{min(on):,.0f}, {max(on):,.0f}] | "
            f"{_paired(off, on)} | {len(g['http'])} | "
            f"{_ms(g['http'])} | {_ms(g['p4rt'])} | {g['cpu'][0] * 1e3:.1f} ms, "
            f"{g['cpu'][1] * 1e3:.1f} ms | {sum(g['cpu']) / args.interval:.2%} of a core |"
        )
    lines += [
        "",
        "The switch's CPU per scrape is measured without traffic: 50 GETs, then 50 counter "
        "reads back to back, the switch process's CPU time (/proc/PID/stat) less its idle "
        "rate; the eBPF switch's process only serves the control plane (the kernel forwards), "
        "so its CPU is taken from the senders' cores, not from its pipeline. On/off (paired): "
        "the median of each rep's ratio of its two windows, side by side in time, [min, max]; "
        f"the machine's load average at the end: {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores.",
    ]
    failures = [f"{t}: {f}" for t, g in got.items() for f in g["failures"]]
    return lines + (["", "Failed scrapes:", "", *(f"- {f}" for f in failures)] if failures else [])


def _paired(off: list[float], on: list[float]) -> str:
    """The median of the reps' on/off ratios (each of two windows side by side) [min, max]."""
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    return f"{statistics.median(ratios):.3f}x [{min(ratios):.2f}, {max(ratios):.2f}]"


def _ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.1f} ms" if seconds else "-"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench/results/scrape_cost.md."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", nargs="+", choices=TARGETS, default=None)
    p.add_argument("--reps", type=int, default=5, help="windows per target and mode")
    p.add_argument("--window", type=float, default=3.0, help="seconds of sending per window")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    p.add_argument(
        "--senders",
        dest="sender",
        default="c:1",
        metavar="SENDER",
        help="python (this process) or c:N (N processes of the C sender, bench/rawsend.c)",
    )
    p.add_argument(
        "--scrape",
        nargs="+",
        choices=["http", "p4rt"],
        default=["http", "p4rt"],
        help="what a scrape does: http (GET the switch's /metrics), p4rt (read its counters "
        "as the controller's poller does); both by default",
    )
    p.add_argument("--name", default="scrape_cost", help="results file stem")
    args = p.parse_args(argv)
    targets = args.targets or [t for t in TARGETS if t in available_targets()]
    problems = [f"{t}: {target_problem(t)}" for t in targets if target_problem(t)]
    if problems:
        p.error("; ".join(problems))
    got = run(targets, args.reps, args.window, args.interval, args.sender, args.scrape)
    publish(args.name, report(got, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
