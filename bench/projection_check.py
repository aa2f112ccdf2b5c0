"""The projection checked against this machine: calibrate (bench/calibration.py), then
measure dense fixed-point steps through one switch at several W (worker threads, as in
bench/aggregation.py) and gloo's all_reduce at the same W, alternating, and put each
beside the model's prediction for this machine (the W workers and the switch sharing its
cores). Also per-worker bytes: the switch's measured (packets sent x frame) against the
ring's 2(W-1)/W of the gradient."""

from __future__ import annotations

import os
import statistics
from typing import Any

import numpy as np

from bench import rawsend
from bench.aggregation import GlooPool, SwitchGroup
from bench.calibration import INITIAL_TIMEOUT, available_cores, switch_pps_of, threaded_costs
from bench.projection_model import (
    BYTES_PER_ELEMENT,
    Cluster,
    frame_bytes,
    ring_step,
    switch_step,
)
from homagg.wire.constants import CELLS_PER_PKT, MAX_WORKERS_PER_JOB

TOLERANCE = 0.25  # the check's bound on |predicted / measured - 1|
LOOPBACK_GBPS = 1000.0  # veth and loopback: no wire, the CPU is the limit (nominal rate)


def measure_switch(target: str, worlds: list[int], n: int, reps: int, gloo: GlooPool) -> dict:
    """Per W: the switch's steps (wall, CPU of the worker threads and of the switch
    process, packets, retransmissions) and gloo's all_reduce of the same n at the same W,
    alternating rep by rep; the cores a probe found free just before."""
    from homagg.lab.fabric import Fabric
    from homagg.worker.codecs import FixedPoint

    rng = np.random.default_rng(2)
    out: dict[int, dict[str, Any]] = {}
    for w in worlds:
        fabric = Fabric(target, w)
        group = None
        try:
            for h in fabric.hosts:
                h.enable_ip_stack()
            group = SwitchGroup(fabric, w, INITIAL_TIMEOUT)
            xs = [rng.standard_normal(n).astype(np.float32) for _ in range(w)]
            codecs = [FixedPoint(w) for _ in range(w)]
            group.step(codecs, [x[: n // 8] for x in xs])  # warm-up
            rec: dict[str, Any] = {"cores": available_cores(), "reps": []}
            for rep in range(reps):
                got = _switch_rep(group, codecs, xs, fabric.switch.proc.pid)
                got["gloo"], got["gloo_cpu"] = gloo.run_cpu(w, n)
                rec["reps"].append(got)
                print(
                    f"  {target} W={w} rep {rep + 1}/{reps}: switch {got['secs'] * 1e3:.0f} ms "
                    f"(retx {got['retx']}), gloo {got['gloo'] * 1e3:.1f} ms",
                    flush=True,
                )
            out[w] = rec
        finally:
            if group is not None:
                group.close()
            fabric.close()
    return out


def _switch_rep(group: SwitchGroup, codecs: list, xs: list, pid: int) -> dict[str, Any]:
    """One step of every worker: wall, the CPU of this process (the worker threads; on
    eBPF the switch's program too) and of the switch process, packets the workers sent."""
    sent0 = sum(t.stats.packets_sent for t in group.transports)
    cpu0, switch0 = os.times(), rawsend.process_cpu(pid)
    secs, results, retx = group.step(codecs, xs)
    cpu, switch = os.times(), rawsend.process_cpu(pid)
    if any(not np.array_equal(results[0], r) for r in results[1:]):
        raise RuntimeError(f"W={group.w}: workers decoded different sums")
    return {
        "secs": secs,
        "worker_cpu": cpu.user - cpu0.user + cpu.system - cpu0.system,
        "switch_cpu": switch - switch0,
        "packets": sum(t.stats.packets_sent for t in group.transports) - sent0,
        "retx": retx,
    }


def _median(rec: dict, key: str) -> float:
    return statistics.median(r[key] for r in rec["reps"])


def this_machine(
    w: int,
    n: int,
    switch_pps: float,
    cores: float,
    depth: int = 0,
    workers_per_leaf: int = MAX_WORKERS_PER_JOB,
) -> Cluster:
    """The cluster this machine is: W worker threads and the switch (or a tree's
    switches: `depth` levels, leaves of `workers_per_leaf`) on `cores` cores. This one
    process, its switches and gloo's ranks are one session, so one scheduling group: the
    cores it got are what a ready process of it gets at most (0 cores: a host each)."""
    return Cluster(
        workers=w,
        link_gbps=LOOPBACK_GBPS,
        elements=n,
        switch_pps=switch_pps,
        cores=cores,
        share=min(1.0, cores) if cores else 1.0,
        depth=depth,
        workers_per_leaf=workers_per_leaf,
    )


def rows(record: dict, measured: dict[str, dict], n: int) -> list[dict]:
    """Predicted beside measured, per target and W, for the switch and for gloo's ring."""
    out = []
    for target, per_w in measured.items():
        for w, rec in per_w.items():
            costs = threaded_costs(record, target, w)
            cluster = this_machine(w, n, switch_pps_of(record, target, w), rec["cores"])
            sw = switch_step(cluster, costs, "fixed_point", verdict=False)
            ring = ring_step(cluster, costs)
            packets = statistics.median(r["packets"] for r in rec["reps"]) / w
            out.append(
                {
                    "target": target,
                    "workers": w,
                    "cores": rec["cores"],
                    "retx": sum(r["retx"] for r in rec["reps"]),
                    "switch_predicted_s": sw.seconds,
                    "switch_measured_s": _median(rec, "secs"),
                    "switch_limit": sw.limit,
                    "switch_cpu_predicted_s": sw.cpu_seconds,
                    "switch_cpu_measured_s": _median(rec, "worker_cpu")
                    + _median(rec, "switch_cpu"),
                    # CPU per packet a worker sent: the worker threads', the switch process's
                    "worker_us_measured": _median(rec, "worker_cpu") / (w * packets) * 1e6,
                    "switch_us_measured": _median(rec, "switch_cpu") / (w * packets) * 1e6,
                    "gloo_predicted_s": ring.seconds,
                    "gloo_measured_s": _median(rec, "gloo"),
                    "gloo_limit": ring.limit,
                    "gloo_cpu_predicted_s": ring.cpu_seconds,
                    "gloo_cpu_measured_s": _median(rec, "gloo_cpu"),
                    "switch_bytes_predicted": sw.bytes_per_worker,
                    "switch_bytes_measured": packets * frame_bytes(CELLS_PER_PKT),
                    "ring_bytes": ring.bytes_per_worker,
                }
            )
    return out


def _err(pred: float, meas: float) -> str:
    e = pred / meas - 1
    return f"{e:+.0%}{'' if abs(e) <= TOLERANCE else ' (miss)'}"


def report(record: dict, rows_: list[dict], n: int) -> list[str]:
    """Markdown: step time, then CPU, predicted vs measured (switch and gloo), then the
    CPU per packet beside the calibration's, then bytes per worker."""
    lines = [
        f"Dense fixed point through one switch (W worker threads) and gloo's all_reduce "
        f"(W processes), n = {n:,} float32 ({BYTES_PER_ELEMENT * n / 1e6:.1f} MB), median "
        f"of the repetitions; 'miss' where off by more than "
        f"{TOLERANCE:.0%}. Predicted for this machine: W workers and the switch on the "
        "cores a probe found free just before (cores free); cores got: the step's measured "
        "CPU / its wall time.",
        "",
        "| target | method | W | cores free | predicted ms | measured ms | error | bound by "
        "| cores got | CPU predicted ms | CPU measured ms | CPU error |",
        "|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r in rows_:
        for m, name in (("switch", "switch, fixed point"), ("gloo", "gloo ring")):
            wall, cpu = r[f"{m}_measured_s"], r[f"{m}_cpu_measured_s"]
            lines.append(
                f"| {r['target']} | {name} | {r['workers']} | {r['cores']:.2f} | "
                f"{r[f'{m}_predicted_s'] * 1e3:.1f} | {wall * 1e3:.1f} | "
                f"{_err(r[f'{m}_predicted_s'], wall)} | {r[f'{m}_limit']} | {cpu / wall:.2f} | "
                f"{r[f'{m}_cpu_predicted_s'] * 1e3:.1f} | {cpu * 1e3:.1f} | "
                f"{_err(r[f'{m}_cpu_predicted_s'], cpu)} |"
            )
    lines += [
        "",
        "Where the switch's CPU went, us per packet a worker sent, beside the calibration "
        "(W = 1); retransmissions over the repetitions:",
        "",
        "| target | W | worker threads measured | calibrated | switch process measured "
        "| calibrated | retx |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows_:
        cal = record["targets"][r["target"]]
        lines.append(
            f"| {r['target']} | {r['workers']} | {r['worker_us_measured']:.1f} | "
            f"{cal['worker_cpu_s'] * 1e6:.1f} | {r['switch_us_measured']:.1f} | "
            f"{cal['switch_process_s'] * 1e6:.1f} | {r['retx']} |"
        )
    return lines + _bytes_table(rows_, n)


def _bytes_table(rows_: list[dict], n: int) -> list[str]:
    dense = BYTES_PER_ELEMENT * n
    lines = [
        "",
        "Bytes each worker sends per step, x the dense gradient: the switch's measured "
        "(packets its transport sent x the frame) and predicted, flat in W; the ring's "
        "2(W-1)/W (its TCP payload; with headers in brackets); step time measured, switch "
        "over gloo:",
        "",
        "| target | W | switch measured | switch predicted | ring 2(W-1)/W | ring / switch "
        "bytes | switch / gloo time |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows_:
        w = r["workers"]
        lines.append(
            f"| {r['target']} | {w} | {r['switch_bytes_measured'] / dense:.3f} | "
            f"{r['switch_bytes_predicted'] / dense:.3f} | {2 * (w - 1) / w:.3f} "
            f"({r['ring_bytes'] / dense:.3f}) | "
            f"{r['ring_bytes'] / r['switch_bytes_measured']:.2f}x | "
            f"{r['switch_measured_s'] / r['gloo_measured_s']:.0f}x |"
        )
    return [*lines, ""]


def summary(rows_: list[dict]) -> str:
    """The check's one line: how many predictions fell within the tolerance."""

    def within(kind: str) -> str:
        ok = sum(
            abs(r[f"{m}{kind}_predicted_s"] / r[f"{m}{kind}_measured_s"] - 1) <= TOLERANCE
            for r in rows_
            for m in ("switch", "gloo")
        )
        return f"{ok}/{2 * len(rows_)}"

    return (
        f"projection check: within {TOLERANCE:.0%} of the measured step time in "
        f"{within('')} rows, of the measured CPU in {within('_cpu')}"
    )
