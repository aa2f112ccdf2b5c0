"""Senders and CPU probes of bench/switch_rate.py: the C sender (bench/rawsend.c, sendmmsg
on the hosts' raw sockets, built at run time with cc into build/bench/, outside git) in
one or more processes, the CPU a process used, and the eBPF program's own run time from
the kernel's BPF statistics: what tells whether the senders or the data plane was the
limit of a measured rate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from homagg.lab import REPO_ROOT
from homagg.lab.namespace import netns_path

SOURCE = Path(__file__).with_name("rawsend.c")
BINARY = REPO_ROOT / "build" / "bench" / "rawsend"
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def build() -> Path:
    """The C sender, compiled with cc unless up to date; RuntimeError with cc's message."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler (cc) for the C sender")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [cc, "-O2", "-Wall", "-o", str(BINARY), str(SOURCE)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"cc failed on {SOURCE.name}:\n{done.stderr}")
    return BINARY


def send_c(
    frames: dict[int, list[bytes]], hosts: list, batch: int, processes: int
) -> tuple[float, int, float]:
    """Send every rank's frames (batch by batch, awaiting each batch's results) from
    `processes` C sender processes, the ranks dealt round-robin; returns the wall seconds
    from the first start to the last end, the results missing, and the senders' CPU
    seconds (user + system)."""
    binary = build()
    lengths = {len(f) for fs in frames.values() for f in fs}
    if len(lengths) != 1:
        raise ValueError("the C sender takes frames of one length")
    length = lengths.pop()
    batches = len(frames[0]) // batch
    with tempfile.TemporaryDirectory(prefix="rawsend-") as tmp:
        specs: list[list[str]] = [[] for _ in range(processes)]
        for rank, fs in frames.items():
            path = Path(tmp) / f"rank{rank}"
            path.write_bytes(b"".join(fs))
            h = hosts[rank]
            specs[rank % processes].append(f"{netns_path(h.namespace)}:{h.iface}:{path}")
        cmd = [str(binary), str(length), str(batch), str(batches), "2000"]
        procs = [
            subprocess.Popen(cmd + s, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for s in specs
            if s
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120)[0].split() for p in procs]
    start = min(float(o[0]) for o in outs)
    end = max(float(o[1]) for o in outs)
    cpu = sum(float(o[3]) + float(o[4]) for o in outs)
    return end - start, sum(int(o[2]) for o in outs), cpu


def process_cpu(pid: int) -> float:
    """User + system CPU seconds that process `pid` (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bpf_program_ids(prefix: str = "switch_ingress") -> set[int]:
    """The ids of the loaded BPF programs whose name starts with `prefix` (bpftool prog
    show: the TC program and its XDP stage, whose name the kernel cuts to 15 characters);
    empty without bpftool. The ids that appear while a fabric starts are its switch's."""
    if shutil.which("bpftool") is None:
        return set()
    out = subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=False
    ).stdout
    return {p["id"] for p in json.loads(out or "[]") if p.get("name", "").startswith(prefix)}


def bpf_program_stats(ids: set[int]) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs `ids`, from `bpftool prog show`
    (counted while kernel.bpf_stats_enabled is 1); (0, 0) for no ids."""
    ns = cnt = 0
    for i in sorted(ids):
        out = subprocess.run(
            ["bpftool", "-j", "prog", "show", "id", str(i)], capture_output=True, text=True
        ).stdout
        prog = json.loads(out or "{}")
        ns += prog.get("run_time_ns", 0)
        cnt += prog.get("run_cnt", 0)
    return ns, cnt


class BpfStats:
    """kernel.bpf_stats_enabled set to 1 for the `with` block and put back after: the
    kernel then counts each program's run time (a few ns per run of its own)."""

    def __enter__(self) -> BpfStats:
        self.before = BPF_STATS.read_text().strip() if BPF_STATS.exists() else None
        if self.before is not None:
            BPF_STATS.write_text("1")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            BPF_STATS.write_text(self.before)
