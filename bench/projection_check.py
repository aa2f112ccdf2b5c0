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
from bench.calibration import INITIAL_TIMEOUT, available_cores, costs_of, switch_pps_of
from bench.projection_model import (
    BYTES_PER_ELEMENT,
    Cluster,
    frame_bytes,
    ring_step,
    switch_step,
)
from homagg.wire.constants import CELLS_PER_PKT

TOLERANCE = 0.25  # the check's bound on |predicted / measured - 1|
LOOPBACK_GBPS = 1000.0  # veth and loopback: no wire, the CPU is the limit (nominal rate)


def measure_switch(target: str, worlds: list[int], n: int, reps: int, gloo: GlooPool) -> dict:
    """Per W: the switch's step wall seconds, packets a worker sent, retransmissions, and
    gloo's all_reduce of the same n at the same W, alternating rep by rep."""
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
            rec: dict[str, Any] = {"switch": [], "gloo": [], "packets": 0, "retx": 0}
            rec["cores"] = available_cores()
            rec.update(switch_cpu=[], gloo_cpu=[])
            pid = fabric.switch.proc.pid
            for rep in range(reps):
                sent0 = sum(t.stats.packets_sent for t in group.transports)
                cpu0, switch0 = os.times(), rawsend.process_cpu(pid)
                secs, results, retx = group.step(codecs, xs)
                cpu = os.times()
                rec["switch_cpu"].append(
                    cpu.user
                    - cpu0.user
                    + cpu.system
                    - cpu0.system
                    + rawsend.process_cpu(pid)
                    - switch0
                )
                if any(not np.array_equal(results[0], r) for r in results[1:]):
                    raise RuntimeError(f"{target} W={w}: workers decoded different sums")
                rec["switch"].append(secs)
                rec["packets"] += sum(t.stats.packets_sent for t in group.transports) - sent0
                rec["retx"] += retx
                gloo_secs, gloo_cpu = gloo.run_cpu(w, n)
                rec["gloo"].append(gloo_secs)
                rec["gloo_cpu"].append(gloo_cpu)
                print(
                    f"  {target} W={w} rep {rep + 1}/{reps}: switch {secs * 1e3:.0f} ms "
                    f"(retx {retx}), gloo {rec['gloo'][-1] * 1e3:.1f} ms",
                    flush=True,
                )
            rec["packets_per_worker"] = rec["packets"] / reps / w
            out[w] = rec
        finally:
            if group is not None:
                group.close()
            fabric.close()
    return out


def this_machine(w: int, n: int, record: dict, target: str, cores: float) -> Cluster:
    """The cluster this machine is: W workers and the switch on `cores` cores."""
    return Cluster(
        workers=w,
        link_gbps=LOOPBACK_GBPS,
        elements=n,
        switch_pps=switch_pps_of(record, target),
        cores=cores,
    )


def rows(record: dict, measured: dict[str, dict], n: int) -> list[dict]:
    """Predicted beside measured, per target and W, for the switch and for gloo's ring."""
    out = []
    for target, per_w in measured.items():
        costs = costs_of(record, target)
        for w, rec in per_w.items():
            cluster = this_machine(w, n, record, target, rec["cores"])
            sw = switch_step(cluster, costs, "fixed_point")
            ring = ring_step(cluster, costs)
            out.append(
                {
                    "target": target,
                    "workers": w,
                    "switch_predicted_s": sw.seconds,
                    "switch_measured_s": statistics.median(rec["switch"]),
                    "switch_limit": sw.limit,
                    "gloo_predicted_s": ring.seconds,
                    "gloo_measured_s": statistics.median(rec["gloo"]),
                    "gloo_limit": ring.limit,
                    "switch_cpu_predicted_s": sw.cpu_seconds,
                    "switch_cpu_measured_s": statistics.median(rec["switch_cpu"]),
                    "gloo_cpu_predicted_s": ring.cpu_seconds,
                    "gloo_cpu_measured_s": statistics.median(rec["gloo_cpu"]),
                    "switch_bytes_predicted": sw.bytes_per_worker,
                    "switch_bytes_measured": rec["packets_per_worker"] * frame_bytes(CELLS_PER_PKT),
                    "ring_bytes": ring.bytes_per_worker,
                    "retx": rec["retx"],
                    "cores": rec["cores"],
                }
            )
    return out


def _err(pred: float, meas: float) -> str:
    e = pred / meas - 1
    return f"{e:+.0%}{'' if abs(e) <= TOLERANCE else ' (miss)'}"


def report(rows_: list[dict], n: int) -> list[str]:
    """Markdown: step time and CPU predicted vs measured (switch and gloo), then bytes."""
    lines = [
        f"Dense fixed point through one switch (W worker threads) and gloo's all_reduce "
        f"(W processes), n = {n:,} float32 ({BYTES_PER_ELEMENT * n / 1e6:.1f} MB), median "
        f"ms of the repetitions; predicted for this machine (W workers and the switch on its "
        f"{os.cpu_count()} cores, all of them ours); 'miss' where off by more than "
        f"{TOLERANCE:.0%}. CPU: all workers' (and the reference switch process's) CPU "
        "seconds per step, which the machine's other load does not change; cores got: "
        "measured CPU / measured wall.",
        "",
        "| target | method | W | predicted ms | measured ms | error | bound by "
        "| CPU predicted ms | CPU measured ms | error | cores got |",
        "|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r in rows_:
        for m, name in (("switch", "switch, fixed point"), ("gloo", "gloo ring")):
            wall, cpu = r[f"{m}_measured_s"], r[f"{m}_cpu_measured_s"]
            lines.append(
                f"| {r['target']} | {name} | {r['workers']} | "
                f"{r[f'{m}_predicted_s'] * 1e3:.1f} | {wall * 1e3:.1f} | "
                f"{_err(r[f'{m}_predicted_s'], wall)} | {r[f'{m}_limit']} | "
                f"{r[f'{m}_cpu_predicted_s'] * 1e3:.1f} | {cpu * 1e3:.1f} | "
                f"{_err(r[f'{m}_cpu_predicted_s'], cpu)} | {cpu / wall:.2f} |"
            )
    dense = BYTES_PER_ELEMENT * n
    lines += [
        "",
        "Bytes each worker sends per step, x the dense gradient: the switch's measured "
        "(packets its transport sent x the frame) and predicted, flat in W; the ring's "
        "2(W-1)/W (its TCP payload; with headers in brackets):",
        "",
        "| target | W | switch measured | switch predicted | ring 2(W-1)/W | ring / switch |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows_:
        w = r["workers"]
        lines.append(
            f"| {r['target']} | {w} | {r['switch_bytes_measured'] / dense:.3f} | "
            f"{r['switch_bytes_predicted'] / dense:.3f} | {2 * (w - 1) / w:.3f} "
            f"({r['ring_bytes'] / dense:.3f}) | "
            f"{r['ring_bytes'] / r['switch_bytes_measured']:.2f}x |"
        )
    return [*lines, ""]
