"""The projection's costs measured on this machine with the aggregation benchmark's pieces
(bench/aggregation.py: SwitchGroup's worker threads, GlooPool's gloo ranks), kept in a
small JSON under bench/results/ that bench/projection.py reads.

Per switch target, one worker (W = 1) streams dense fixed-point steps: its CPU per packet
(this process's user + system time: the transport, its system calls and, on a veth, the
kernel's path, in which the eBPF switch runs too), the reference switch's CPU per contribution
(its process), and the unloaded round trip (a chunk's first send to its result, one packet
a phase). gloo's alpha (latency per ring step), its latency per call, its CPU per step and per
call come from small all_reduces at W = 2 and 4; its per-byte costs (wall and CPU) from
a large one at W = 2. Per software switch (the reference switch, BMv2), what forwarding an
ordinary frame costs its process (bench/forwarding_cost.py): gloo's frames cross it in
Mininet."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import rawsend
from bench.aggregation import GlooPool, SwitchGroup
from bench.forwarding_cost import forwarding_costs, forwarding_threads
from bench.projection_model import BYTES_PER_ELEMENT, Costs, ModelError
from bench.publish import RESULTS
from bench.run_load import GroupSampler, share_of

CALIBRATION_PATH = RESULTS / "projection_calibration.json"
RTT_STEPS = 40  # tiny steps (one packet a phase) whose chunk latencies give the round trip
GLOO_SMALL = 256  # elements: an all_reduce this small is alpha alone
SMALL_REPS = 15  # small all_reduces per W (milliseconds each; their medians fit alpha)
INITIAL_TIMEOUT = 0.02  # the aggregation benchmark's, on the reference switch and eBPF
SOFTWARE_SWITCHES = ("refswitch", "bmv2")  # a process whose CPU a contribution costs
THREADS = 4  # worker threads of the second calibration step (the per-thread term)


def switch_costs(target: str, n: int, reps: int) -> dict[str, float]:
    """Costs per packet of one worker on `target` (W = 1): seconds, medians over reps; and
    the worker CPU per packet with THREADS worker threads in this one process (their
    contention for the interpreter: a per-thread term of the aggregation benchmark's)."""
    out, rtt = _group_costs(target, 1, n, reps)
    out["rtt_s"] = rtt
    threaded, _ = _group_costs(target, THREADS, n // THREADS, reps)
    out["worker_cpu_threads_s"] = threaded["worker_cpu_s"]
    # the switch's CPU a contribution with THREADS workers' traffic interleaved (a software
    # switch's: its per-packet cost is not constant under contention)
    out["switch_process_threads_s"] = threaded["switch_process_s"]
    out["threads"] = THREADS
    return out


def _group_costs(target: str, w: int, n: int, reps: int) -> tuple[dict[str, float], float]:
    """Medians over `reps` steps of `w` worker threads on `target` (per packet a worker
    sent), and the round trip of a one-packet phase."""
    from homagg.lab.fabric import Fabric
    from homagg.worker.codecs import FixedPoint

    before = rawsend.bpf_program_ids()
    fabric = Fabric(target, w)
    progs = rawsend.bpf_program_ids() - before
    group = None
    try:
        for h in fabric.hosts:
            h.enable_ip_stack()
        group = SwitchGroup(fabric, w, 0.2 if target.startswith("bmv2") else INITIAL_TIMEOUT)
        x = [np.random.default_rng(1 + i).standard_normal(n).astype(np.float32) for i in range(w)]
        codec = [FixedPoint(w) for _ in range(w)]
        group.step(codec, [v[:100_000] for v in x])  # warm-up
        rows = []
        pid = fabric.switch.proc.pid
        with rawsend.BpfStats():
            for _ in range(reps):
                rows.append(_one_step(group, codec, x, pid, progs))
        transport = group.transports[0]
        transport.stats.latencies.clear()
        for _ in range(RTT_STEPS if w == 1 else 0):
            group.step(codec, [v[:64] for v in x])
        rtt = statistics.median(transport.stats.latencies or [0.0])
    finally:
        if group is not None:
            group.close()
        fabric.close()
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}, rtt


def _one_step(group: SwitchGroup, codec: list, x: list, pid: int, progs: set[int]) -> dict:
    """One timed step: wall and CPU per packet a worker sent (all threads' over all
    packets)."""

    def sent_now() -> int:
        return sum(t.stats.packets_sent for t in group.transports)

    sent0, cpu0 = sent_now(), os.times()
    switch0, bpf0 = rawsend.process_cpu(pid), rawsend.bpf_program_stats(progs)
    wall, _, _ = group.step(codec, x)
    cpu, bpf = os.times(), rawsend.bpf_program_stats(progs)
    sent = sent_now() - sent0
    return {
        "wall_per_packet_s": wall / sent,
        "worker_cpu_s": (cpu.user - cpu0.user + cpu.system - cpu0.system) / sent,
        "worker_user_s": (cpu.user - cpu0.user) / sent,
        "switch_process_s": (rawsend.process_cpu(pid) - switch0) / sent,
        "bpf_program_s": (bpf[0] - bpf0[0]) * 1e-9 / sent,
    }


SPIN = (
    "import time\ncpu = time.process_time()\nend = time.perf_counter() + {s}\n"
    "while time.perf_counter() < end:\n    pass\nprint(time.process_time() - cpu)"
)


def available_cores(seconds: float = 0.5) -> float:
    """The cores this benchmark would get now: CPU seconds that os.cpu_count() busy
    processes get in `seconds` of wall time, over those seconds (the machine's other
    load takes the rest)."""
    code = SPIN.format(s=seconds)
    procs = [
        subprocess.Popen([sys.executable, "-S", "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(os.cpu_count() or 1)
    ]
    cpu = 0.0
    for p in procs:
        out, _ = p.communicate(timeout=60 + seconds)
        cpu += float(out)
    return cpu / seconds


def gloo_costs(gloo: GlooPool, n: int, reps: int) -> dict[str, float]:
    """gloo's latency per ring step (alpha) and per call, and its CPU per step and per
    call, from small all_reduces at W = 2 and 4 (2 and 6 steps); its per-byte costs from a
    large one at W = 2 (where 2(W-1)/W = 1: every rank sends n elements' bytes)."""
    gloo.run(2, n)  # warm-up: connections, buffers
    small = {}
    for w in (2, 4):
        got = [gloo.run_cpu(w, GLOO_SMALL) for _ in range(SMALL_REPS)]
        small[w] = (statistics.median(t for t, _ in got), statistics.median(c for _, c in got) / w)
    big = [gloo.run_cpu(2, n) for _ in range(reps)]
    alpha = max(0.0, small[4][0] - small[2][0]) / 4
    step_cpu = max(0.0, small[4][1] - small[2][1]) / 4
    call, call_cpu = max(0.0, small[2][0] - 2 * alpha), max(0.0, small[2][1] - 2 * step_cpu)
    payload = BYTES_PER_ELEMENT * n
    big_wall = statistics.median(t for t, _ in big) - small[2][0]
    big_cpu = statistics.median(c for _, c in big) / 2 - small[2][1]
    return {
        "alpha_s": alpha,
        "call_s": call,
        "step_cpu_s": step_cpu,
        "call_cpu_s": call_cpu,
        "peer_byte_s": max(0.0, big_wall) / payload,
        "peer_cpu_byte_s": max(0.0, big_cpu) / payload,
    }


def costs_of(record: dict[str, Any], target: str) -> Costs:
    """The model's Costs for one calibrated target: the reference switch's process is
    serial (its packet rate goes to the cluster's switch_pps, not here); the eBPF
    program runs in the workers' system time, so it is already in their CPU."""
    if target not in record.get("targets", {}):
        raise ModelError(
            f"no calibration for target {target!r} in {CALIBRATION_PATH.name}; run "
            "`python -m bench.projection --calibrate` as root (calibrated: "
            f"{', '.join(record.get('targets', {})) or 'none'})"
        )
    t, g = record["targets"][target], record["gloo"]
    # wall-time costs as on an idle machine: what was measured, at the share of a core a
    # ready process got meanwhile (CPU-time costs need no such correction)
    share = record.get("share", 1.0)
    return Costs(
        worker_packet_s=t["worker_cpu_s"],
        rtt_s=t["rtt_s"] * share,
        alpha_s=g["alpha_s"] * share,
        call_s=g["call_s"] * share,
        call_cpu_s=g["call_cpu_s"],
        step_cpu_s=g["step_cpu_s"],
        peer_byte_s=g["peer_byte_s"] * share,
        worker_cpu_s=t["worker_cpu_s"],
        switch_cpu_s=t["switch_process_s"],
        peer_cpu_byte_s=g["peer_cpu_byte_s"],
        switch_threads=forwarding_threads(record, target),
    )


def switch_cpu_at(record: dict[str, Any], target: str, members: int = 1) -> float:
    """A calibrated software switch's CPU a contribution with `members` workers' traffic
    interleaved at it: between its costs at 1 and THREADS workers, linearly, held at the
    measured ends (BMv2's grows by about a third from 1 to 4 workers here, the reference
    switch's does not)."""
    t = record["targets"][target]
    one = float(t["switch_process_s"])
    many, threads = t.get("switch_process_threads_s"), t.get("threads", 1)
    if many is None or threads <= 1 or one <= 0:
        return one
    at = min(max(members, 1), threads)
    return one + (float(many) - one) * (at - 1) / (threads - 1)


def switch_pps_of(record: dict[str, Any], target: str, members: int = 1) -> float:
    """The calibrated switch's packet rate with `members` workers at it: its process's work
    per contribution over the cores its threads spread it on (one for the reference
    switch, BMv2's measured by forwarding: bench/forwarding_cost.py); 0 (no bound of its
    own) for the eBPF program."""
    per = switch_cpu_at(record, target, members)
    if target not in SOFTWARE_SWITCHES or per <= 0:
        return 0.0
    return forwarding_threads(record, target) / per


def threaded_costs(record: dict[str, Any], target: str, w: int) -> Costs:
    """A calibrated target's costs for W worker threads of one process (the aggregation
    benchmark's): the worker's CPU per packet grows by a per-thread term, calibrated from
    1 and THREADS threads (their contention for the interpreter and their wake-ups)."""
    costs, t = costs_of(record, target), record["targets"][target]
    if "worker_cpu_threads_s" not in t:
        return costs
    one, many = t["worker_cpu_s"], t["worker_cpu_threads_s"]
    growth = (many / one - 1) / (t["threads"] - 1)
    # never below the smaller measurement: fewer wake-ups a packet with more threads
    # (a loaded machine's W = 1 waits alone) make the term negative, not unbounded
    per = max(min(one, many), one * (1 + growth * (w - 1)))
    switch = switch_cpu_at(record, target, w) if costs.switch_cpu_s else 0.0
    return replace(costs, worker_packet_s=per, worker_cpu_s=per, switch_cpu_s=switch)


def cluster_costs(record: dict[str, Any], target: str) -> tuple[Costs, float]:
    """A calibrated target's costs for a cluster, each worker on a host of its own (no
    shared-core terms), and its switch packet rate (0: no bound of its own)."""
    costs = replace(costs_of(record, target), worker_cpu_s=0.0, switch_cpu_s=0.0)
    return costs, switch_pps_of(record, target)


def calibrate(
    targets: list[str], n: int, reps: int, gloo: GlooPool, forwarding: list[str]
) -> dict[str, Any]:
    """Measure every target's switch costs, gloo's, and what forwarding a frame costs each
    of the `forwarding` software switches, with when and where."""
    record: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average": round(os.getloadavg()[0], 2),
        "elements": n,
        "reps": reps,
        "targets": {},
    }
    with GroupSampler() as groups:
        for target in targets:
            print(f"calibration: {target}, W = 1 and {THREADS}, {n:,} elements", flush=True)
            record["targets"][target] = switch_costs(target, n, reps)
        print("calibration: gloo, W = 2 and 4", flush=True)
        record["gloo"] = gloo_costs(gloo, n, reps)
        record["forwarding"] = {}
        for target in forwarding:
            print(f"calibration: {target} forwarding UDP frames", flush=True)
            record["forwarding"][target] = forwarding_costs(target, reps)
    record["runnable_groups"] = round(groups.mean(), 2)
    record["share"] = share_of(float(os.cpu_count() or 1), groups.mean())
    return record


def calibrate_passes(
    passes: int, targets: list[str], n: int, reps: int, gloo: GlooPool, forwarding: list[str]
) -> dict[str, Any]:
    """`passes` whole calibrations, one after the other, merged number by number into their
    medians: a pass measures each target in one fabric, and which cores its processes land
    on moves a cost by 20-40% from one fabric to the next here (a switch's CPU a
    contribution: 46, 66 and 54 us in three passes of an idle machine), more than the
    repetitions inside a pass vary."""
    if passes < 1:
        raise ModelError(f"calibration passes must be >= 1, not {passes}")
    records = []
    for k in range(passes):
        print(f"calibration: pass {k + 1}/{passes}", flush=True)
        records.append(calibrate(targets, n, reps, gloo, forwarding))
    merged = merge_medians(records)
    merged["passes"] = passes
    return merged


def merge_medians(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The records' numbers merged into their medians, key by key (nested dicts merged
    alike); what is not a number (dates, the machine) from the first record."""
    first = records[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        values = [r[key] for r in records if key in r]
        if isinstance(value, dict):
            out[key] = merge_medians([v for v in values if isinstance(v, dict)])
        elif isinstance(value, int | float) and not isinstance(value, bool):
            median = statistics.median(float(v) for v in values)
            out[key] = int(median) if isinstance(value, int) and median.is_integer() else median
        else:
            out[key] = value
    return out


def save(record: dict[str, Any], path: Path = CALIBRATION_PATH) -> None:
    """Write the calibration JSON (committed: the model's default costs)."""
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def load(path: Path = CALIBRATION_PATH) -> dict[str, Any]:
    """The calibration JSON; a ModelError that says how to make it when missing."""
    if not path.exists():
        raise ModelError(
            f"no calibration at {path.name}: run `python -m bench.projection --calibrate` "
            "as root, or give the costs (--worker-us, --rtt-us, --alpha-us)"
        )
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def describe(record: dict[str, Any]) -> list[str]:
    """Markdown lines: the calibrated costs, in microseconds."""
    lines = [
        f"Calibrated {record['date']} on {record['machine']} (load average "
        f"{record['load_average']}), {record['elements']:,} elements, median of "
        f"{record['reps']}{_passes(record)}:",
        "",
        "| target | worker CPU us/packet (user part) | switch process us/contribution, 1 "
        f"worker (and {THREADS}) | eBPF program us/packet | wall us/packet at W = 1 | round "
        "trip us |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, t in record["targets"].items():
        many = t.get("switch_process_threads_s")
        lines.append(
            f"| {name} | {t['worker_cpu_s'] * 1e6:.1f} ({t['worker_user_s'] * 1e6:.1f}) | "
            f"{t['switch_process_s'] * 1e6:.1f}"
            + (f" ({many * 1e6:.1f})" if many is not None else "")
            + f" | {t['bpf_program_s'] * 1e6:.2f} | "
            f"{t['wall_per_packet_s'] * 1e6:.1f} | {t['rtt_s'] * 1e6:.0f} |"
        )
    g = record["gloo"]
    lines += [
        "",
        f"gloo (loopback; small all_reduces at W = 2 and 4, a large one at W = 2): alpha "
        f"{g['alpha_s'] * 1e6:.0f} us a step and {g['call_s'] * 1e6:.0f} us a call; CPU a "
        f"rank {g['step_cpu_s'] * 1e6:.0f} us a step and {g['call_cpu_s'] * 1e6:.0f} us a call; "
        f"{g['peer_byte_s'] * 1e9:.2f} ns wall and {g['peer_cpu_byte_s'] * 1e9:.2f} ns CPU "
        "per byte a rank sends.",
        "",
    ]
    if record.get("forwarding"):
        lines += [
            "Forwarding a routed UDP frame (host to host through the switch, 32 in flight): "
            + "; ".join(
                f"{name} {f['forward_small_s'] * 1e6:.1f} us CPU a 64-byte frame, "
                f"{f['forward_frame_s'] * 1e6:.1f} a 1514-byte one "
                f"({f['forward_wall_s'] * 1e6:.0f} us wall a frame"
                + (
                    f"; one frame crosses it idle in {f['forward_latency_s'] * 1e6:.0f} us)"
                    if "forward_latency_s" in f
                    else ")"
                )
                for name, f in record["forwarding"].items()
            )
            + ".",
            "",
        ]
    return lines


def _passes(record: dict[str, Any]) -> str:
    """How a calibration of several passes was merged, for its first line (else nothing)."""
    passes = record.get("passes", 1)
    return f" in each of {passes} passes, merged into their medians" if passes > 1 else ""


def as_json(costs: Costs) -> dict[str, float]:
    """Costs as plain numbers (for --json)."""
    return asdict(costs)
