"""The projection checked against Mininet training runs (`python -m run`, docs/run.md):
from a run's output directory (its per-step records switch.jsonl and gloo.jsonl, its
printed first line saved as run.log, its controller.toml for the tree, load.jsonl for the
machine's load while it ran: bench/run_load.py), the model's prediction of a step's
communication beside what the run measured.

Switch: the model's dense fixed-point step (bench/projection_model.py) for the gradient the
hook aggregated (agg_dense), the run's W, link rate, tree and pool, each rank a process and
each switch one, on this machine's cores at the share of a core its load left a ready
process, against the transport's time per step (encode + wait + decode, mean over the
ranks). gloo: the ring and the software switch's forwarding of its frames and ACKs (at the
calibrated cost of each frame's size: bench/forwarding_cost.py) against the gloo run's step
time less the step's computation, which the switch run measures as its step time less its
switch and agreement time (both runs compute the same batches). The step's agreement: its
seal, a small all_gather through the switch started after the step's last bucket, of which
the step pays what the next step's computation does not cover, against the switch run's
agreement time."""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.calibration import costs_of, switch_cpu_at, switch_pps_of
from bench.forwarding_cost import crossing_latency, frame_cost
from bench.projection_check import LOOPBACK_GBPS, TOLERANCE
from bench.projection_model import (
    BYTES_PER_ELEMENT,
    Cluster,
    Costs,
    ModelError,
    Projection,
    packets,
    phase_cells,
    ring_step,
    switch_step,
)
from bench.run_load import PhaseLoad, phase_load
from homagg.wire.constants import MAX_WORKERS_PER_JOB

RUN_LOG = "run.log"  # the run's printed output, as `python -m run ... | tee run.log` saves it
LOAD_LOG = "load.jsonl"  # the machine's load during the run (bench/run_load.py)
PEER_FRAME_BYTES = 1514  # a full TCP frame of gloo's stream on the wire (Ethernet included)
ACK_FRAME_BYTES = 66  # Ethernet, IPv4, TCP with timestamps, no payload
# a small message's ring step over gloo's TCP pairs: the receiver's NOTIFY_RECV_READY, then
# the data (gloo/transport/tcp/pair.cc: a send waits for it), each with its ACK
GLOO_MESSAGES_A_STEP = 2
GLOO_FRAMES_A_HOP = 4
ACKS_PER_FRAME = 0.5  # delayed ACKs: one a second full segment (RFC 1122), back the same way
DEFAULT_POOL = 8  # a run's pool when its controller's log is missing: make run's until 11-28
PHASES = ("switch", "gloo")  # a run trains through the switch, then over gloo
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
    leaves: int = 0  # leaf switches of the tree (0: one switch)


def pool_size(controller_log: str) -> int:
    """The job's pool from the controller's log ('... pool size N ...'); the run's default
    when the log does not say."""
    m = re.search(r"pool size (\d+)", controller_log)
    return int(m[1]) if m else DEFAULT_POOL


def parse_first_line(
    text: str, levels: int = 1, pool: int = DEFAULT_POOL, leaves: int = 0
) -> RunInfo:
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
        leaves=leaves,
    )


def switch_levels(controller_toml: str) -> int:
    """Switch levels of a run's topology: 2 when a switch of its config has a parent."""
    return 2 if leaf_count(controller_toml) else 1


def leaf_count(controller_toml: str) -> int:
    """Switches of a run's config that have a parent: the tree's leaves."""
    return len(re.findall(r"^parent\s*=", controller_toml, re.MULTILINE))


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
    # the machine's load in each phase (load.jsonl; None: the run was not sampled)
    load: dict[str, PhaseLoad | None] = field(default_factory=dict)


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
    toml = (path / "controller.toml").read_text()
    log = path / "controller.log"
    pool = pool_size(log.read_text()) if log.exists() else DEFAULT_POOL
    info = parse_first_line(
        (path / RUN_LOG).read_text(), switch_levels(toml), pool, leaf_count(toml)
    )
    if info.codec not in ("fixed_point", "lossless") or info.model != "mlp":
        raise ModelError(
            f"{path}: model {info.model}, codec {info.codec}: the check models dense "
            "gradients (--model mlp) through fixed_point or lossless (every element nonzero)"
        )
    if info.overlap != "blocking":
        raise ModelError(f"{path}: overlap {info.overlap}: the check needs blocking steps")
    sampled = (path / LOAD_LOG).read_text().splitlines() if (path / LOAD_LOG).exists() else []
    return MeasuredRun(
        path,
        info,
        step_medians((path / "switch.jsonl").read_text().splitlines()),
        step_medians((path / "gloo.jsonl").read_text().splitlines()),
        {m: phase_load(sampled, m, WARMUP_STEPS) if sampled else None for m in PHASES},
    )


def costs_for(
    record: dict[str, Any], target: str, switch_pps: float, members: int = 1
) -> tuple[Costs, float]:
    """The calibrated costs for a run's target and the switch's packet rate (a software
    switch's CPU a contribution: the reference switch's, BMv2's when calibrated, with the
    busiest switch's `members` workers interleaved at it). BMv2 not calibrated takes the
    reference switch's worker costs and the packet rate given
    (bench/results/switch_rate.md measures it)."""
    if target in record.get("targets", {}):
        costs = costs_of(record, target)
        if costs.switch_cpu_s:
            costs = replace(costs, switch_cpu_s=switch_cpu_at(record, target, members))
        return costs, switch_pps_of(record, target, members)
    if target.startswith("bmv2"):
        if not switch_pps:
            raise ModelError(
                f"{target} is not calibrated: calibrate it (`python -m bench.projection "
                "--calibrate --targets refswitch bmv2`) or give its contributions/s with "
                "--switch-pps (bench/results/switch_rate.md measures it)"
            )
        costs = costs_of(record, "refswitch")
        # BMv2's own threads: its rate is the bound, not one core's CPU a contribution
        return Costs(**{**vars(costs), "switch_cpu_s": 0.0}), switch_pps
    return costs_of(record, target), switch_pps


def gloo_frames(ring_wire: float, workers: int) -> float:
    """Frames of one ring all-reduce that a switch forwards (each frame once): every
    rank's full TCP frames and the ACKs of what it receives."""
    return workers * ring_wire / PEER_FRAME_BYTES * (1 + ACKS_PER_FRAME)


def crossings(info: RunInfo) -> float:
    """Switches a ring hop's frames cross on average: one on a star; in a tree the hops
    between leaves (one per leaf of W) cross the leaf, the top and the other leaf."""
    return 1.0 + 2 * info.leaves / info.hosts if info.leaves else 1.0


def forwarding_cpu(record: dict[str, Any], target: str, ring_wire: float, info: RunInfo) -> float:
    """CPU seconds the switches spend forwarding one ring all-reduce's frames (full data
    frames and their ACKs, each at its size's calibrated cost: bench/forwarding_cost.py)."""
    data = info.hosts * ring_wire / PEER_FRAME_BYTES
    per_ring = data * frame_cost(record, target, PEER_FRAME_BYTES)
    per_ring += data * ACKS_PER_FRAME * frame_cost(record, target, ACK_FRAME_BYTES)
    return per_ring * crossings(info)


def busiest_hops(info: RunInfo) -> int:
    """Hops of a ring step that the busiest switch forwards: all W on a star; in a tree a
    leaf's own ranks' hops and the one that enters it from another leaf (W / leaves + 1)."""
    if not info.leaves:
        return info.hosts
    return math.ceil(info.hosts / info.leaves) + 1


def busiest_fraction(info: RunInfo) -> float:
    """The busiest switch's part of the ring's forwarding: all of it on a star; in a tree
    its hops (busiest_hops) of the W, out of the crossings all switches make."""
    if not info.leaves:
        return 1.0
    return busiest_hops(info) / info.hosts / crossings(info)


def gloo_through_switch(
    ring: Projection,
    cluster: Cluster,
    costs: Costs,
    info: RunInfo,
    forward_s: float,
    latency_share: float = 1.0,
) -> tuple[float, str]:
    """gloo's ring in the run: in Mininet its TCP frames (and their ACKs) cross the
    software switch, whose CPU on them (`forward_s`) is a bound beside the ring's own: the
    busiest switch's share of it over the cores its threads spread it on
    (costs.switch_threads: BMv2's pipeline threads), and all the CPU (the ranks' and the
    switches') over the cores the run's processes get. The ring's latency overlaps the
    forwarding (every step's frames queue at the busy switch), so it bounds the step
    rather than adding to it. Seconds, and the bound."""
    c, w = cluster, info.hosts
    latency = (costs.call_s + 2 * (w - 1) * costs.alpha_s) / latency_share
    # the busiest switch keeps a core while the ranks wait on its forwarding: it shares
    # the cores with the machine's other load and with the other switches, all as busy
    own = min(latency_share, c.cores / c.switch_processes) if c.cores else latency_share
    busiest = forward_s * busiest_fraction(info) / (costs.switch_threads * own)
    cpu = ring.cpu_seconds + forward_s
    bounds = {
        ring.limit: ring.seconds,
        "switch's forwarding": max(latency, busiest),
        "cpu with forwarding": cpu / min(c.cores, (w + c.switch_processes) * c.share),
    }
    top = max(bounds, key=lambda k: bounds[k])
    return bounds[top], top


def path_crossings(info: RunInfo) -> int:
    """Switches the longest hop of a ring step crosses: one on a star; in a tree a hop
    from one leaf to another crosses the leaf, the top and the other leaf. Every step of a
    ring has such a hop once the ranks span leaves, and a step lasts as long as its
    slowest hop."""
    return 3 if info.leaves > 1 else 1


def agreement(
    cluster: Cluster,
    costs: Costs,
    record: dict[str, Any],
    info: RunInfo,
    latency_share: float = 1.0,
) -> float:
    """The step's seal over gloo (homagg/worker/ddp/fallback.py): a small MAX by one
    all_gather (homagg/worker/ddp/gathered_max.py), W-1 ring steps. On loopback a step is
    alpha: gloo's TCP pairs send a message only once its receiver has announced the
    receive (NOTIFY_RECV_READY), two hand-offs a step. In
    Mininet both messages also cross the switches on the step's slowest hop, each an idle
    switch's crossing latency (bench/forwarding_cost.py), and the busiest switch forwards
    the step's frames of all its hops one after another (the announcement, the data and
    an ACK of each: small frames at its calibrated cost, over the cores its threads use).
    The ranks wait on each other in turn, so each runs at the share of a core the
    machine's other load leaves it, not the share of the ranks side by side."""
    w, target = info.hosts, info.target
    crossing = GLOO_MESSAGES_A_STEP * path_crossings(info) * crossing_latency(record, target)
    frames = busiest_hops(info) * GLOO_FRAMES_A_HOP * frame_cost(record, target, ACK_FRAME_BYTES)
    step = costs.alpha_s + crossing + frames / costs.switch_threads
    return (costs.call_s + (w - 1) * step) / latency_share


def exposed_seal(seal_s: float, compute_s: float, ranks: int = 1, cores: float = 0.0) -> float:
    """What a step pays of its seal: it starts after the step's last bucket and is read
    before the next step's first, so the next step's computation (the optimizer, forward
    and backward up to that bucket: all of it with one bucket) covers that much of it,
    where each rank has a core of its own. With more ranks than `cores` on the machine
    (0: a machine per rank) nothing is covered: each hop of the seal's ring waits for its
    rank's gloo thread to get a core, and the ranks computing hold them."""
    if cores and ranks > cores:
        return seal_s
    return max(0.0, seal_s - compute_s)


def run_cluster(run: MeasuredRun, switch_pps: float, cores: float, phase: str) -> Cluster:
    """This machine as the run had it in `phase`: W hosts (a process each) and the
    switch(es) on `cores` cores, each ready process at the share of a core the machine's
    load left it (measured in the run; 1 when the run was not sampled)."""
    i = run.info
    load = run.load.get(phase)
    return Cluster(
        workers=i.hosts,
        link_gbps=i.link_mbit / 1e3 if i.link_mbit else LOOPBACK_GBPS,
        elements=round(run.switch["agg_dense"] / BYTES_PER_ELEMENT),
        switch_pps=switch_pps,
        depth=i.levels,
        pool_size=i.pool_size,
        cores=cores,
        share=load.share(cores) if load else 1.0,
        rank_processes=True,
        workers_per_leaf=math.ceil(i.hosts / i.leaves) if i.leaves else MAX_WORKERS_PER_JOB,
    )


def latency_share(run: MeasuredRun, cores: float, phase: str) -> float:
    """The share of a core a process of the run got in `phase` when it ran alone (the
    machine's other load only; 1 when the run was not sampled)."""
    load = run.load.get(phase)
    return load.latency_share(cores) if load else 1.0


def row(run: MeasuredRun, record: dict[str, Any], switch_pps: float, cores: float) -> dict:
    """Predicted beside measured for one run: the switch's step, gloo's all-reduce, the
    step's agreement, and packets a rank sent per step (the model's phases against the
    transport's count)."""
    # the busiest switch's workers: all of them on a star, a leaf's in a tree
    i = run.info
    members = math.ceil(i.hosts / i.leaves) if i.leaves else i.hosts
    costs, pps = costs_for(record, run.info.target, switch_pps, members)
    cluster = run_cluster(run, pps, cores, "switch")
    gloo_cluster = run_cluster(run, pps, cores, "gloo")
    codec = run.info.codec
    sw, ring = switch_step(cluster, costs, codec), ring_step(gloo_cluster, costs)
    w, s, g = run.info.hosts, run.switch, run.gloo
    forward_s = forwarding_cpu(record, run.info.target, ring.bytes_per_worker, run.info)
    gloo_s, gloo_limit = gloo_through_switch(
        ring, gloo_cluster, costs, run.info, forward_s, latency_share(run, cores, "gloo")
    )
    model_packets = sum(
        packets(phase_cells(codec, cluster.elements, 1.0, w), cluster.cells_per_packet)
    )
    load_s, load_g = run.load.get("switch"), run.load.get("gloo")
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
        "share_switch": cluster.share,
        "share_gloo": gloo_cluster.share,
        "threads_switch": load_s.runnable if load_s else 0.0,
        "threads_gloo": load_g.runnable if load_g else 0.0,
        "groups_switch": load_s.groups if load_s else 0.0,
        "groups_gloo": load_g.groups if load_g else 0.0,
        "switch_predicted_s": sw.seconds,
        "switch_measured_s": s["switch_seconds"],
        "switch_limit": sw.limit,
        "encode_s": s["encode_seconds"],
        "wait_s": s["wait_seconds"],
        "decode_s": s["decode_seconds"],
        "seal_s": (
            seal := agreement(cluster, costs, record, run.info, latency_share(run, cores, "switch"))
        ),
        "agreement_predicted_s": exposed_seal(seal, s["compute_seconds"], w, cores),
        "agreement_measured_s": s["agreement_seconds"],
        "agreement_limit": "latency",
        "compute_s": s["compute_seconds"],
        "gloo_loopback_s": ring.seconds,
        "gloo_predicted_s": gloo_s,
        "gloo_measured_s": max(0.0, g["seconds"] - s["compute_seconds"]),
        "gloo_step_s": g["seconds"],
        "gloo_limit": gloo_limit,
        # switch_packets: every rank's contributions and the results it received
        "packets_measured": s["switch_packets"] / (2 * w),
        "packets_predicted": model_packets,
        "retx": s["retransmissions"],
        "gloo_tx_measured": g["tx_bytes"],
        # its data frames and the ACKs of what it receives (as many frames as it sends)
        "gloo_tx_predicted": ring.bytes_per_worker
        * (1 + ACKS_PER_FRAME * ACK_FRAME_BYTES / PEER_FRAME_BYTES),
        "rtt_calibrated_s": costs.rtt_s,
        # the switch processes' CPU a contribution in the run (sampled) beside the
        # calibration's, and what a contribution cost in wall time were it the only bound
        "contribution_cpu_s": _per_step(load_s, "switch_cpu_s") / (w * model_packets),
        "contribution_implied_s": s["switch_seconds"] / (w * model_packets),
        "contribution_model_s": costs.switch_cpu_s or (1.0 / pps if pps else 0.0),
        "forward_cpu_s": _per_step(load_g, "switch_cpu_s"),
        "forward_model_s": forward_s,
        # frames the switches received a gloo step (every crossing), and their mean size:
        # full 1,514-byte frames and ACKs, unless the hosts' TCP handed over larger ones
        "gloo_frames_measured": _per_step(load_g, "switch_frames"),
        "gloo_frame_bytes_measured": (
            load_g.switch_frame_bytes / load_g.switch_frames
            if load_g and load_g.switch_frames
            else 0.0
        ),
        "gloo_frames_predicted": gloo_frames(ring.bytes_per_worker, w) * crossings(run.info),
        "round_trip_s": s["wait_seconds"]
        * run.info.pool_size
        / max(1.0, s["switch_packets"] / (2 * w)),
        "steps": s["steps"],
    }


def _per_step(load: PhaseLoad | None, key: str) -> float:
    """A phase's sampled CPU per step (0 when not sampled)."""
    if load is None or load.steps <= 0:
        return 0.0
    return float(getattr(load, key)) / load.steps


def error(predicted: float, measured: float) -> float:
    """predicted / measured - 1 (inf when nothing was measured)."""
    return predicted / measured - 1 if measured > 0 else float("inf")


def _err(predicted: float, measured: float) -> str:
    e = error(predicted, measured)
    return f"{e:+.0%}{'' if abs(e) <= TOLERANCE else ' (miss)'}"


METHODS = (("switch", "switch, {codec}"), ("gloo", "gloo ring"), ("agreement", "agreement"))


def report(rows_: list[dict]) -> list[str]:
    """Markdown: per run, the switch's and gloo's communication per step and the step's
    agreement, predicted and measured, then where the switch's step went."""
    lines = [
        "Communication per training step (median over the steps after the first "
        f"{WARMUP_STEPS}), predicted for this machine beside the run's measurement; 'miss' "
        f"where off by more than {TOLERANCE:.0%}. This machine: W hosts (a process each) and "
        "the switch processes on its cores, a ready process getting the share of a core the "
        "machine's load left it (cores / ready scheduling groups, sampled during the phase: "
        "bench/run_load.py). Switch measured: the transport's encode + wait + decode (mean over "
        "the ranks); gloo measured: the gloo run's step less the switch run's computation; "
        "agreement: the part of the step's seal (over gloo, started after its last bucket) "
        "that the next step's computation does not cover, measured by the switch run.",
        "",
        "| run | target | W | levels | method | ready threads / groups | share | predicted ms | "
        "measured ms | error | bound by |",
        "|---|---|--:|--:|---|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows_:
        for m, name in METHODS:
            p, got = r[f"{m}_predicted_s"], r[f"{m}_measured_s"]
            phase = "gloo" if m == "gloo" else "switch"
            lines.append(
                f"| {r['run']} | {r['target']} | {r['workers']} | {r['levels']} | "
                f"{name.format(codec=r['codec'])} | {r[f'threads_{phase}']:.0f} / "
                f"{r[f'groups_{phase}']:.1f} | "
                f"{r[f'share_{phase}']:.2f} | {p * 1e3:.1f} | {got * 1e3:.1f} | "
                f"{_err(p, got)} | {r[f'{m}_limit']} |"
            )
    lines += [
        "",
        "Where a switch step went (ms, measured); packets a rank sent per step; gloo's kB a "
        "rank sent per step; the switch processes' CPU per contribution in the run (sampled) "
        "and per gloo ring (forwarding its frames and ACKs), beside the calibration's:",
        "",
        "| run | step | compute | encode | wait | decode | gloo step | packets measured / "
        "predicted | gloo kB measured / predicted | retx a step | switch CPU us a contribution "
        "run / calibrated | forwarding CPU ms a ring run / calibrated | switch frames a gloo "
        "step run / model (bytes a frame) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows_:
        step = r["compute_s"] + r["switch_measured_s"] + r["agreement_measured_s"]
        lines.append(
            f"| {r['run']} | {step * 1e3:.1f} | {r['compute_s'] * 1e3:.1f} | "
            f"{r['encode_s'] * 1e3:.1f} | {r['wait_s'] * 1e3:.1f} | {r['decode_s'] * 1e3:.1f} | "
            f"{r['gloo_step_s'] * 1e3:.1f} | "
            f"{r['packets_measured']:.0f} / {r['packets_predicted']} | "
            f"{r['gloo_tx_measured'] / 1e3:.1f} / {r['gloo_tx_predicted'] / 1e3:.1f} | "
            f"{r['retx']:g} | {r['contribution_cpu_s'] * 1e6:.0f} / "
            f"{r['contribution_model_s'] * 1e6:.0f} | {r['forward_cpu_s'] * 1e3:.1f} / "
            f"{r['forward_model_s'] * 1e3:.1f} | {_frames(r)} |"
        )
    if len(configurations(rows_)) < len(rows_):
        lines += ["", *configuration_report(configurations(rows_))]
    return [*lines, "", f"Summary: {summary(rows_)}.", ""]


def _frames(r: dict) -> str:
    """The frames column: measured (when sampled) / predicted, and the measured mean size."""
    model = f"{r['gloo_frames_predicted']:,.0f}"
    if not r["gloo_frames_measured"]:
        return f"- / {model}"
    got = r["gloo_frames_measured"]
    return f"{got:,.0f} / {model} ({r['gloo_frame_bytes_measured']:,.0f})"


CONFIG_KEYS = ("target", "workers", "levels", "pool_size", "codec", "link_mbit")


def configurations(rows_: list[dict]) -> list[dict]:
    """The runs grouped by what they ran (target, W, levels, pool, codec, links): per group
    and method the median prediction and the median measurement, so that the check of a
    configuration run several times is not one run's noise."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows_:
        groups.setdefault(tuple(r[k] for k in CONFIG_KEYS), []).append(r)
    out = []
    for key, runs in groups.items():
        c: dict[str, Any] = dict(zip(CONFIG_KEYS, key))
        c["runs"] = len(runs)
        for m, _ in METHODS:
            for part in ("predicted", "measured"):
                c[f"{m}_{part}_s"] = statistics.median(r[f"{m}_{part}_s"] for r in runs)
        out.append(c)
    return out


def configuration_report(configs: list[dict]) -> list[str]:
    """Markdown: each configuration's median prediction beside its median run."""
    lines = [
        "Per configuration, the median prediction beside the median run (ms):",
        "",
        "| target | W | levels | pool | runs | method | predicted ms | measured ms | error |",
        "|---|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for c in configs:
        for m, name in METHODS:
            p, got = c[f"{m}_predicted_s"], c[f"{m}_measured_s"]
            lines.append(
                f"| {c['target']} | {c['workers']} | {c['levels']} | {c['pool_size']} | "
                f"{c['runs']} | {name.format(codec=c['codec'])} | {p * 1e3:.1f} | "
                f"{got * 1e3:.1f} | {_err(p, got)} |"
            )
    return [*lines, ""]


def summary(rows_: list[dict]) -> str:
    """The one line: predictions within the tolerance, of all, per method; per run, and
    per configuration (its runs' medians) when a configuration ran more than once."""
    line = _within(rows_, "runs")
    configs = configurations(rows_)
    if len(configs) < len(rows_):
        line += f"; {_within(configs, 'configurations (median of their runs)')}"
    return line


def _within(rows_: list[dict], what: str) -> str:
    """Predictions within the tolerance among `rows_` (runs or configurations)."""

    def within(m: str) -> int:
        return sum(
            abs(error(r[f"{m}_predicted_s"], r[f"{m}_measured_s"])) <= TOLERANCE for r in rows_
        )

    per = ", ".join(f"{m} {within(m)}/{len(rows_)}" for m, _ in METHODS)
    ok = sum(within(m) for m, _ in METHODS)
    return (
        f"projection vs Mininet {what}: within {TOLERANCE:.0%} of the measured communication "
        f"in {ok}/{len(METHODS) * len(rows_)} predictions ({per})"
    )
