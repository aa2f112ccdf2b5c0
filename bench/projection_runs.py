"""The projection checked against Mininet training runs (`python -m run`, docs/run.md):
from a run's output directory (its per-step records switch.jsonl and gloo.jsonl, its
printed first line saved as run.log, its controller.toml for the tree), the model's
prediction of a step's communication beside what the run measured.

Switch: the model's dense fixed-point step (bench/projection_model.py) for the gradient the
hook aggregated (agg_dense), the run's W, link rate, switch levels and pool, on this
machine's cores, against the transport's time per step (encode + wait + decode, mean over
the ranks); the per-bucket agreements the hook runs over gloo are shown beside it, not
modelled. gloo: the model's ring all-reduce of the same gradient against the gloo run's
step time less the step's computation, which the switch run measures as its step time
less its switch and agreement time (both runs compute the same batches)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.calibration import costs_of, switch_pps_of
from bench.projection_check import LOOPBACK_GBPS, TOLERANCE
from bench.projection_model import (
    BYTES_PER_ELEMENT,
    Cluster,
    Costs,
    ModelError,
    packets,
    phase_cells,
    ring_step,
    switch_step,
)

RUN_LOG = "run.log"  # the run's printed output, as `python -m run ... | tee run.log` saves it
PEER_FRAME_BYTES = 1514  # a full TCP frame of gloo's stream on the wire (Ethernet included)
ACK_FRAME_BYTES = 66  # Ethernet, IPv4, TCP with timestamps, no payload
ACKS_PER_FRAME = 0.5  # delayed ACKs: one a second full segment (RFC 1122), back the same way
DEFAULT_POOL = 8  # python -m run's --pool-size default (not on its first line)
WARMUP_STEPS = 2  # first steps left out: connections, the job's set-up, first timeouts
FIRST_LINE = re.compile(
    r"make run: run \d+ on switch target (?P<target>[\w-]+) .*?, (?P<hosts>\d+) hosts, "
    r"model (?P<model>[\w-]+), codec (?P<codec>\w+)[^,]*, overlap (?P<overlap>\w+), "
    r"links (?P<links>unshaped|[\d.]+ Mbit/s)"
)
STEP_KEYS = (
    "seconds",
    "switch_seconds",
    "agreement_seconds",
    "encode_seconds",
    "wait_seconds",
    "decode_seconds",
    "switch_packets",
    "agg_dense",
    "retransmissions",
    "tx_bytes",
)


@dataclass(frozen=True)
class RunInfo:
    """What a run was, from its first line and its controller's config."""

    target: str
    hosts: int
    model: str
    codec: str
    overlap: str
    link_mbit: float  # 0: unshaped (veth: the CPU is the limit)
    levels: int  # switch levels of the job: 2 for the two-level topology
    pool_size: int = DEFAULT_POOL  # slots a rank keeps in flight (the controller's log)


def pool_size(controller_log: str) -> int:
    """The job's pool from the controller's log ('... pool size N ...'); the run's default
    when the log does not say."""
    m = re.search(r"pool size (\d+)", controller_log)
    return int(m[1]) if m else DEFAULT_POOL


def parse_first_line(text: str, levels: int = 1, pool: int = DEFAULT_POOL) -> RunInfo:
    """The RunInfo of a run's printed output (its first `make run:` line)."""
    m = FIRST_LINE.search(text)
    if m is None:
        raise ModelError(
            "no `make run: run K on switch target ...` line in the run's output: save what "
            f"`python -m run` prints as {RUN_LOG} in its --out directory"
        )
    links = m["links"]
    return RunInfo(
        target=m["target"],
        hosts=int(m["hosts"]),
        model=m["model"],
        codec=m["codec"],
        overlap=m["overlap"],
        link_mbit=0.0 if links == "unshaped" else float(links.split()[0]),
        levels=levels,
        pool_size=pool,
    )


def switch_levels(controller_toml: str) -> int:
    """Switch levels of a run's topology: 2 when a switch of its config has a parent."""
    return 2 if re.search(r"^parent\s*=", controller_toml, re.MULTILINE) else 1


def step_medians(lines: list[str], skip: int = WARMUP_STEPS) -> dict[str, float]:
    """Medians over a run's step records (one JSON object a line), the first `skip` steps
    left out, of the numbers the check uses (0 where a record lacks one: gloo's)."""
    records = [json.loads(line) for line in lines if line.strip()]
    if len(records) <= skip:
        raise ModelError(f"{len(records)} step records: need more than the {skip} warm-up steps")
    kept = records[skip:]
    out = {k: statistics.median(float(r.get(k, 0.0)) for r in kept) for k in STEP_KEYS}
    # the step's computation (and the optimizer): what is neither switch nor agreement
    out["compute_seconds"] = statistics.median(
        r["seconds"] - r.get("switch_seconds", 0.0) - r.get("agreement_seconds", 0.0) for r in kept
    )
    out["steps"] = float(len(kept))
    return out


@dataclass(frozen=True)
class MeasuredRun:
    """One run's directory, what it was and its medians per step (switch and gloo)."""

    path: Path
    info: RunInfo
    switch: dict[str, float]
    gloo: dict[str, float]


def load_run(path: Path) -> MeasuredRun:
    """A run's output directory: run.log, controller.toml, switch.jsonl, gloo.jsonl."""
    missing = [
        f
        for f in (RUN_LOG, "controller.toml", "switch.jsonl", "gloo.jsonl")
        if not (path / f).exists()
    ]
    if missing:
        raise ModelError(
            f"{path}: missing {', '.join(missing)}: give the --out directory of a "
            f"`python -m run` without --no-gloo, what it printed saved there as {RUN_LOG}"
        )
    levels = switch_levels((path / "controller.toml").read_text())
    log = path / "controller.log"
    pool = pool_size(log.read_text()) if log.exists() else DEFAULT_POOL
    info = parse_first_line((path / RUN_LOG).read_text(), levels, pool)
    if info.codec not in ("fixed_point", "lossless") or info.model != "mlp":
        raise ModelError(
            f"{path}: model {info.model}, codec {info.codec}: the check models dense "
            "gradients (--model mlp) through fixed_point or lossless (every element nonzero)"
        )
    if info.overlap != "blocking":
        raise ModelError(f"{path}: overlap {info.overlap}: the check needs blocking steps")
    return MeasuredRun(
        path,
        info,
        step_medians((path / "switch.jsonl").read_text().splitlines()),
        step_medians((path / "gloo.jsonl").read_text().splitlines()),
    )


def costs_for(record: dict[str, Any], target: str, switch_pps: float) -> tuple[Costs, float]:
    """The calibrated costs for a run's target and the switch's packet rate: the reference
    switch's as calibrated (a mix of runs checks together); BMv2 (not calibrated) takes the
    reference switch's worker costs and the packet rate given (bench/results/
    switch_rate.md measures it)."""
    if target == "refswitch":
        return costs_of(record, target), switch_pps_of(record, target)
    if target.startswith("bmv2"):
        if not switch_pps:
            raise ModelError(
                f"{target} is not calibrated: give its contributions/s with --switch-pps "
                "(bench/results/switch_rate.md measures it)"
            )
        costs = costs_of(record, "refswitch")
        # BMv2's own threads: its rate is the bound, not one core's CPU a contribution
        return Costs(**{**vars(costs), "switch_cpu_s": 0.0}), switch_pps
    return costs_of(record, target), switch_pps


def frame_cost(record: dict[str, Any], target: str, switch_pps: float) -> float:
    """Seconds of the switch's work per frame it forwards: BMv2 at the rate given, the
    reference switch at its calibrated cost a contribution (forwarding a frame is taken
    to cost what absorbing one does: both are one packet through its Python pipeline)."""
    if target == "refswitch":
        return float(record["targets"]["refswitch"]["switch_process_s"])
    return 1.0 / switch_pps if switch_pps else 0.0


def gloo_frames(ring_wire: float, workers: int) -> float:
    """Frames of one ring all-reduce that the switch forwards: every rank's full TCP
    frames and the ACKs of what it receives."""
    return workers * ring_wire / PEER_FRAME_BYTES * (1 + ACKS_PER_FRAME)


def gloo_through_switch(
    ring_s: float, ring_wire: float, costs: Costs, info: RunInfo, per_frame: float, cores: float
) -> tuple[float, str]:
    """gloo's ring in the run: in Mininet its TCP frames (and their ACKs) cross the switch,
    a software switch here, so the switch's work on them is a bound beside the loopback
    ring's (ring_s). Two levels: a ring hop between leaves crosses three switches, the
    others one; the switches' processes share the cores. Seconds, and the bound when it is
    the switch's work ('' when the loopback ring's)."""
    w = info.hosts
    frames = gloo_frames(ring_wire, w)
    crossings = 1.0
    switches = 1
    if info.levels > 1:
        leaves = 2  # the two-level topology's (mininet/two-level.toml)
        crossings, switches = 1 + 2 * leaves / w, leaves + 1
    work = frames * crossings * per_frame / max(1.0, min(cores, switches))
    latency = costs.call_s + 2 * (w - 1) * costs.alpha_s
    return (ring_s, "") if ring_s >= work + latency else (work + latency, "switch's forwarding")


def run_cluster(run: MeasuredRun, switch_pps: float, cores: float) -> Cluster:
    """This machine as the run had it: W hosts and the switch(es) on `cores` cores."""
    i = run.info
    return Cluster(
        workers=i.hosts,
        link_gbps=i.link_mbit / 1e3 if i.link_mbit else LOOPBACK_GBPS,
        elements=round(run.switch["agg_dense"] / BYTES_PER_ELEMENT),
        switch_pps=switch_pps,
        depth=i.levels,
        pool_size=i.pool_size,
        cores=cores,
    )


def row(run: MeasuredRun, record: dict[str, Any], switch_pps: float, cores: float) -> dict:
    """Predicted beside measured for one run: the switch's step, gloo's all-reduce, and
    packets a rank sent per step (the model's phases against the transport's count)."""
    costs, pps = costs_for(record, run.info.target, switch_pps)
    cluster = run_cluster(run, pps, cores)
    codec = run.info.codec
    sw, ring = switch_step(cluster, costs, codec), ring_step(cluster, costs)
    w, s, g = run.info.hosts, run.switch, run.gloo
    per_frame = frame_cost(record, run.info.target, pps)
    gloo_s, gloo_limit = gloo_through_switch(
        ring.seconds, ring.bytes_per_worker, costs, run.info, per_frame, cores
    )
    model_packets = sum(
        packets(phase_cells(codec, cluster.elements, 1.0, w), cluster.cells_per_packet)
    )
    return {
        "run": run.path.name,
        "target": run.info.target,
        "workers": w,
        "levels": run.info.levels,
        "pool_size": run.info.pool_size,
        "codec": codec,
        "link_mbit": run.info.link_mbit,
        "elements": cluster.elements,
        "cores": cores,
        "switch_predicted_s": sw.seconds,
        "switch_measured_s": s["switch_seconds"],
        "switch_limit": sw.limit,
        "encode_s": s["encode_seconds"],
        "wait_s": s["wait_seconds"],
        "decode_s": s["decode_seconds"],
        "agreement_s": s["agreement_seconds"],
        "compute_s": s["compute_seconds"],
        "gloo_loopback_s": ring.seconds,
        "gloo_predicted_s": gloo_s,
        "gloo_measured_s": max(0.0, g["seconds"] - s["compute_seconds"]),
        "gloo_step_s": g["seconds"],
        "gloo_limit": gloo_limit or ring.limit,
        # switch_packets: every rank's contributions and the results it received
        "packets_measured": s["switch_packets"] / (2 * w),
        "packets_predicted": model_packets,
        "retx": s["retransmissions"],
        "gloo_tx_measured": g["tx_bytes"],
        # its data frames and the ACKs of what it receives (as many frames as it sends)
        "gloo_tx_predicted": ring.bytes_per_worker
        * (1 + ACKS_PER_FRAME * ACK_FRAME_BYTES / PEER_FRAME_BYTES),
        # the slot round trip the switch path saw: pool slots a rank keeps in flight over
        # the time a packet took (the window's bound, had it been the limit)
        "rtt_calibrated_s": costs.rtt_s,
        # what a packet cost the switch in the run, were it the bound: contributions
        # (every rank's, serially) and gloo's frames with their ACKs, beside the model's
        "contribution_implied_s": s["switch_seconds"] / (w * model_packets),
        "contribution_model_s": 1.0 / pps if pps else 0.0,
        "frame_implied_s": max(0.0, g["seconds"] - s["compute_seconds"])
        / gloo_frames(ring.bytes_per_worker, w),
        "frame_model_s": per_frame,
        "round_trip_s": s["wait_seconds"]
        * run.info.pool_size
        / max(1.0, s["switch_packets"] / (2 * w)),
        "steps": s["steps"],
    }


def error(predicted: float, measured: float) -> float:
    """predicted / measured - 1 (inf when nothing was measured)."""
    return predicted / measured - 1 if measured > 0 else float("inf")


def _err(predicted: float, measured: float) -> str:
    e = error(predicted, measured)
    return f"{e:+.0%}{'' if abs(e) <= TOLERANCE else ' (miss)'}"


def report(rows_: list[dict]) -> list[str]:
    """Markdown: per run, the switch's and gloo's communication per step, predicted and
    measured, then where the switch's step went and the packets per rank."""
    lines = [
        "Communication per training step (median over the steps after the first "
        f"{WARMUP_STEPS}), predicted for this machine (W hosts and the switch on the given "
        f"cores) beside the run's measurement; 'miss' where off by more than {TOLERANCE:.0%}. "
        "Switch measured: the transport's encode + wait + decode (mean over the ranks); "
        "gloo measured: the gloo run's step less the switch run's computation; gloo "
        "predicted: the ring with the calibrated (loopback) costs or the switch's work on its "
        "frames and ACKs, whichever is longer (the ring alone in brackets).",
        "",
        "| run | target | W | levels | links | method | predicted ms | measured ms | "
        "predicted / measured | error | bound by |",
        "|---|---|--:|--:|---|---|--:|--:|--:|--:|---|",
    ]
    for r in rows_:
        links = f"{r['link_mbit']:g} Mbit/s" if r["link_mbit"] else "unshaped"
        ring = f" ({r['gloo_loopback_s'] * 1e3:.1f})"
        for m, name in (("switch", f"switch, {r['codec']}"), ("gloo", "gloo ring")):
            p, got = r[f"{m}_predicted_s"], r[f"{m}_measured_s"]
            lines.append(
                f"| {r['run']} | {r['target']} | {r['workers']} | {r['levels']} | {links} | "
                f"{name} | {p * 1e3:.1f}{ring if m == 'gloo' else ''} | {got * 1e3:.1f} | "
                f"{p / got if got else float('inf'):.2f} | {_err(p, got)} | {r[f'{m}_limit']} |"
            )
    lines += [
        "",
        "Where a switch step went (ms, measured); packets a rank sent per step; the slot "
        "round trip the wait implies (pool slots x wait / packets: the window's bound) "
        "against the calibrated one; gloo's kB a rank sent per step; what a contribution "
        "(W of them a packet) and a gloo frame (ACKs included) cost the switch in the run, "
        "were it the only bound, beside the model's:",
        "",
        "| run | step | compute | encode | wait | decode | agreements (not modelled) | "
        "gloo step | packets measured / predicted | round trip ms implied / calibrated "
        "| gloo kB measured / predicted | retx a step | us a contribution implied / model "
        "| us a gloo frame implied / model |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows_:
        step = r["compute_s"] + r["switch_measured_s"] + r["agreement_s"]
        lines.append(
            f"| {r['run']} | {step * 1e3:.1f} | {r['compute_s'] * 1e3:.1f} | "
            f"{r['encode_s'] * 1e3:.1f} | {r['wait_s'] * 1e3:.1f} | {r['decode_s'] * 1e3:.1f} | "
            f"{r['agreement_s'] * 1e3:.1f} | {r['gloo_step_s'] * 1e3:.1f} | "
            f"{r['packets_measured']:.0f} / {r['packets_predicted']} | "
            f"{r['round_trip_s'] * 1e3:.2f} / {r['rtt_calibrated_s'] * 1e3:.2f} | "
            f"{r['gloo_tx_measured'] / 1e3:.1f} / {r['gloo_tx_predicted'] / 1e3:.1f} | "
            f"{r['retx']:g} | {r['contribution_implied_s'] * 1e6:.0f} / "
            f"{r['contribution_model_s'] * 1e6:.0f} | {r['frame_implied_s'] * 1e6:.0f} / "
            f"{r['frame_model_s'] * 1e6:.0f} |"
        )
    return [*lines, "", f"Summary: {summary(rows_)}.", ""]


def summary(rows_: list[dict]) -> str:
    """The one line: predictions within the tolerance, of all."""
    ok = sum(
        abs(error(r[f"{m}_predicted_s"], r[f"{m}_measured_s"])) <= TOLERANCE
        for r in rows_
        for m in ("switch", "gloo")
    )
    return (
        f"projection vs Mininet runs: within {TOLERANCE:.0%} of the measured communication "
        f"in {ok}/{2 * len(rows_)} predictions"
    )


@dataclass(frozen=True)
class RunSpec:
    """A run to start: switch target, topology ('star': 4 unshaped hosts, else a --topo of
    python -m run), steps, pool slots a rank."""

    target: str = "refswitch"
    topo: str = "star"
    steps: int = 12
    pool_size: int = DEFAULT_POOL

    @property
    def name(self) -> str:
        """The run's directory name: target, topology, pool."""
        return f"{self.target}-{self.topo}-pool{self.pool_size}"

    def command(self, out: Path) -> list[str]:
        """The `python -m run` arguments: the dense MLP, fixed point, blocking."""
        cmd = ["-m", "run", "--target", self.target, "--model", "mlp", "--codec", "fixed_point"]
        cmd += ["--steps", str(self.steps), "--pool-size", str(self.pool_size)]
        cmd += ["--hosts", "4"] if self.topo == "star" else ["--topo", self.topo]
        return [*cmd, "--no-plot", "--out", str(out)]


def start_run(out: Path, spec: RunSpec) -> Path:
    """Run `python -m run` (root, Mininet) per `spec`, its printed output saved as run.log
    in `out`; raises when the run fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = spec.command(out)
    print(f"projection runs: python {' '.join(cmd)}", flush=True)
    saved = out.parent / f"{out.name}.{RUN_LOG}"  # the run empties its --out as it starts
    with open(saved, "w") as log:
        done = subprocess.run(
            [sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT, timeout=1800
        )
    saved.replace(out / RUN_LOG)
    # exit 1: the parameter check said DIFFER; the run itself completed
    if done.returncode not in (0, 1):
        raise ModelError(f"`python -m run` failed ({done.returncode}): see {out / RUN_LOG}")
    return out
