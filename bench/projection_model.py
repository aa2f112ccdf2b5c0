"""The projection's cost model: step times of one gradient aggregation through the switch
(dense fixed point or the lossless codec) beside ring and halving-doubling all-reduce in
the alpha-beta model that NCCL's and gloo's algorithms follow, for a cluster a user
describes, from measured per-packet costs and round trips (bench/calibration.py).

Switch: each worker streams P packets per phase through a window of `pool_size` slots;
a packet's steady-state cost is the slowest of the worker's own per-packet cost, the
link's serialization of one frame, the switch's share (its members' contributions per
slot at its packet rate: the busiest switch's, a leaf taking its own workers' and the
parent's result, a parent its children's partials) and the window (pool_size packets per
round trip); every phase adds its last packet's round trip, and every switch level above
the first one more round trip. Ring all-reduce: a call's fixed latency and
2(W-1) steps of n/W bytes, alpha each; halving-doubling (the "tree" algorithms):
2 ceil(log2 W) steps, the same 2(W-1)/W n bytes. When the W workers share `cores` cores
(this machine), the CPU each method needs is also a bound, and so are the worker
process(es) and the software switch's, and every CPU and latency term is slowed by the
share of a core a ready process gets there (the machine's other load): the model's
concession to the checks against measurements here, never used for a cluster."""

from __future__ import annotations

import math
from dataclasses import dataclass

from homagg.wire.constants import (
    AGG_FRAME_BYTES,
    CELLS_PER_PKT,
    ETH_HEADER_BYTES,
    IPV4_HEADER_BYTES,
    MAX_WORKERS_PER_JOB,
)

BYTES_PER_ELEMENT = 4  # float32 gradients; the switch's cells are int32 too
EXP_BLOCK = 16384  # elements per shared exponent (homagg/worker/codecs/exponent.py)
TCP_FRAME_OVERHEAD = ETH_HEADER_BYTES + IPV4_HEADER_BYTES + 20  # per MTU frame of the peers
PEER_MTU_PAYLOAD = 1500 - IPV4_HEADER_BYTES - 20  # TCP payload bytes per 1500-byte frame
CODECS = ("fixed_point", "lossless")


class ModelError(ValueError):
    """A cluster or cost that the model cannot project (says which and why)."""


@dataclass(frozen=True)
class Costs:
    """Per-packet costs and round trips: measured here (bench/calibration.py) or what a
    user assumes for a cluster. A zero cost means 'never the limit' (line rate)."""

    worker_packet_s: float = 0.0  # a worker's own work per packet sent and result received
    switch_packet_s: float = 0.0  # the switch's work per contribution (0: line rate)
    rtt_s: float = 10e-6  # worker -> switch -> worker, one packet, unloaded
    alpha_s: float = 10e-6  # one step of a peer algorithm (send to a neighbour, unloaded)
    call_s: float = 0.0  # a peer all-reduce's fixed latency per call, beside its steps
    peer_byte_s: float = 0.0  # a peer's host cost per byte sent (0: the link is the limit)
    # CPU per packet / per byte, for `cores` (shared hosts): worker's, switch's, a peer's
    worker_cpu_s: float = 0.0
    switch_cpu_s: float = 0.0
    call_cpu_s: float = 0.0  # a peer's CPU per all-reduce call ...
    step_cpu_s: float = 0.0  # ... and per step, in addition to its bytes'
    peer_cpu_byte_s: float = 0.0
    switch_threads: float = 1.0  # cores a busy software switch spreads its CPU over (BMv2's)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not math.isfinite(value) or value < 0:
                raise ModelError(f"cost {name} must be a finite number >= 0, not {value}")
        if self.switch_threads < 1:
            raise ModelError(f"switch_threads must be >= 1, not {self.switch_threads}")


@dataclass(frozen=True)
class Cluster:
    """What a user describes: W workers, each on its own link to a switch (a leaf of
    `depth` levels when depth > 1), a gradient of `elements` float32 with `density`
    nonzeros per worker at independent positions (the lossless codec's worst case)."""

    workers: int
    link_gbps: float
    elements: int
    density: float = 1.0
    switch_pps: float = 0.0  # contributions/s the switch absorbs in all (0: line rate)
    depth: int = 0  # switch levels; 0: as few as hold W (32 workers per switch)
    pool_size: int = 0  # slots a worker keeps in flight; 0: the bandwidth-delay product
    cells_per_packet: int = CELLS_PER_PKT
    cores: float = 0.0  # >0: all workers share this many cores (this machine), else a host each
    compute_s: float = 0.0  # the step's computation, not overlapped with the aggregation
    # this machine only (cores > 0): the share of a core a ready process gets (the machine's
    # other load: cores / runnable scheduling groups, measured), whether each worker is a
    # process of its own (Mininet's ranks) or all are threads of one (the benchmark's), and
    # the workers a leaf holds in a tree (the two-level topology's 4)
    share: float = 1.0
    rank_processes: bool = False
    workers_per_leaf: int = MAX_WORKERS_PER_JOB

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ModelError(f"workers must be >= 1, not {self.workers}")
        if not (math.isfinite(self.link_gbps) and self.link_gbps > 0):
            raise ModelError(
                f"link rate must be > 0 Gbit/s, not {self.link_gbps}: a link that carries "
                "nothing never finishes a step (give e.g. --link-gbps 100)"
            )
        if self.elements < 0 or not 0.0 <= self.density <= 1.0:
            raise ModelError("elements must be >= 0 and density within [0, 1]")
        if self.switch_pps < 0 or self.pool_size < 0 or self.cells_per_packet < 1:
            raise ModelError("switch_pps and pool_size must be >= 0, cells_per_packet >= 1")
        if self.depth < 0 or self.cores < 0 or self.compute_s < 0:
            raise ModelError("depth, cores and compute_s must be >= 0")
        if not 0.0 < self.share <= 1.0 or not 1 <= self.workers_per_leaf <= MAX_WORKERS_PER_JOB:
            raise ModelError(
                f"share must be within (0, 1] and workers_per_leaf within 1..{MAX_WORKERS_PER_JOB}"
            )
        top = switch_levels(self)[-1].members
        if top > MAX_WORKERS_PER_JOB:
            raise ModelError(
                f"{self.workers} workers need more than {self.levels} switch level(s): the top "
                f"one would hold {top} members, at most {MAX_WORKERS_PER_JOB}"
            )

    @property
    def levels(self) -> int:
        """Switch levels: the given depth, else the fewest that hold W workers (one switch
        up to 32, else leaves of workers_per_leaf under parents of 32 members each)."""
        if self.depth:
            return self.depth
        if self.workers <= MAX_WORKERS_PER_JOB:
            return 1
        levels, below = 2, math.ceil(self.workers / self.workers_per_leaf)
        while below > MAX_WORKERS_PER_JOB:
            levels, below = levels + 1, math.ceil(below / MAX_WORKERS_PER_JOB)
        return levels

    @property
    def leaves(self) -> int:
        """Leaf switches (0: a single switch): W over a leaf's workers."""
        return math.ceil(self.workers / self.workers_per_leaf) if self.levels > 1 else 0

    @property
    def switch_processes(self) -> int:
        """Switches of the job: a software switch is a process each on this machine."""
        return sum(level.switches for level in switch_levels(self))

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


@dataclass(frozen=True)
class Projection:
    """One method's projected step: seconds, and bytes each worker sends."""

    method: str
    seconds: float
    bytes_per_worker: float
    limit: str = ""  # what bounds it (worker, link, switch, window, cpu, latency)
    cpu_seconds: float = 0.0  # CPU all workers (and a software switch) spend on it


def union_fraction(density: float, workers: int) -> float:
    """Expected fraction of positions nonzero at some worker, supports independent."""
    return 1.0 - (1.0 - density) ** workers


VERDICT_CELLS = 1  # the hook's verdict packet after a bucket's phases (SwitchVerdict)


def phase_cells(
    codec: str, elements: int, density: float, workers: int, verdict: bool = True
) -> list[int]:
    """Cells each worker sends per phase of one step: the codec's phases (closed forms of
    homagg/worker/codecs/fixed_point.py and lossless.py), then, in training (`verdict`),
    the DDP hook's verdict packet (homagg/worker/ddp/agreement.py: one cell a bucket; the
    aggregation benchmark's transports send none)."""
    phases = codec_phase_cells(codec, elements, density, workers)
    return [*phases, VERDICT_CELLS] if phases and verdict else phases


def codec_phase_cells(codec: str, elements: int, density: float, workers: int) -> list[int]:
    """Cells each worker sends per phase of the codec (none for an empty gradient)."""
    n = elements
    if n == 0:
        return []
    blocks = math.ceil(n / EXP_BLOCK)
    if codec == "fixed_point":
        return [blocks, n + 1]  # MAX of the block exponents; ADD of values and a status cell
    if codec != "lossless":
        raise ModelError(f"unknown codec {codec!r}; one of {', '.join(CODECS)}")
    # OR: exponent bits (9 cells a block), the support's first level and a status cell
    first = math.ceil(n / 1024) + 9 * blocks + 1
    u = union_fraction(density, workers)
    if u == 0.0:
        return [first]  # an empty union: no second level, no values
    words = math.ceil(n / 32 * (1.0 - (1.0 - u) ** 32))  # nonzero 32-element words
    return [first, words, math.ceil(u * n) + 64]  # + the values' fingerprint


def packets(cells: list[int], cells_per_packet: int) -> list[int]:
    """Packets per phase for the given cells per phase."""
    return [math.ceil(c / cells_per_packet) for c in cells]


def frame_bytes(cells_per_packet: int) -> int:
    """One aggregation frame on the wire (Ethernet, IPv4, UDP, header, cells)."""
    return AGG_FRAME_BYTES - 4 * CELLS_PER_PKT + 4 * cells_per_packet


@dataclass(frozen=True)
class SwitchLevel:
    """One level of a job's switches: how many, and the members the busiest one holds
    (workers at a leaf, the level below's switches above it)."""

    switches: int
    members: int
    top: bool

    @property
    def absorbs(self) -> int:
        """Packets the busiest switch of the level takes in per slot: a contribution from
        each member and, below the top, the result coming back down from its parent (its
        partial going up replaces the result a single switch multicasts)."""
        return self.members + (0 if self.top else 1)


def switch_levels(cluster: Cluster) -> list[SwitchLevel]:
    """The job's switches level by level, leaves first, the top last (one level: a single
    switch holding every worker)."""
    levels, below, cap = [], cluster.workers, cluster.workers_per_leaf
    for _ in range(cluster.levels - 1):
        switches = math.ceil(below / cap)
        levels.append(SwitchLevel(switches, min(below, cap), top=False))
        below, cap = switches, MAX_WORKERS_PER_JOB
    return [*levels, SwitchLevel(1, below, top=True)]


def switch_absorbs(cluster: Cluster) -> int:
    """Packets the job's switches take in per slot of a phase, all of them: every worker's
    contribution, and in a tree each switch's partial at its parent and the parent's
    result back at that switch."""
    return sum(level.switches * level.absorbs for level in switch_levels(cluster))


def busiest_switch_absorbs(cluster: Cluster) -> int:
    """Packets the busiest of the job's switches takes in per slot of a phase: what bounds
    the step by a switch's packet rate and by one switch process's CPU alike."""
    return max(level.absorbs for level in switch_levels(cluster))


def switch_step(cluster: Cluster, costs: Costs, codec: str, verdict: bool = True) -> Projection:
    """One step through the switch with `codec`: steady-state packets at the slowest
    per-packet cost, plus one round trip per phase and per extra switch level (`verdict`:
    a training step's, with the hook's verdict packet; phase_cells)."""
    c, w = cluster, cluster.workers
    cells = phase_cells(codec, c.elements, c.density, w, verdict)
    per_phase = packets(cells, c.cells_per_packet)
    total = sum(per_phase)
    frame = frame_bytes(c.cells_per_packet)
    rtt = costs.rtt_s * c.levels / c.share  # the tree adds one switch round trip per level
    bounds = {
        "worker": costs.worker_packet_s / c.share,
        "link": frame / c.link_bytes_per_s,
        # line rate (0): every port forwards at its link's rate, already the link's bound;
        # in a tree the busiest switch's packets a slot (a leaf: its workers' and a result)
        "switch": busiest_switch_absorbs(c) / c.switch_pps / c.share if c.switch_pps else 0.0,
        "window": rtt / (c.pool_size or max(1, math.ceil(rtt * c.link_bytes_per_s / frame))),
    }
    limit = max(bounds, key=lambda k: bounds[k])
    seconds = total * bounds[limit]
    switch_cpu = switch_absorbs(c) * total * costs.switch_cpu_s
    cpu_total = w * total * costs.worker_cpu_s + switch_cpu
    if c.cores:  # workers (and a software switch) share the cores: CPU is a bound too
        top, cpu = _cpu_bound(c, w * total * costs.worker_cpu_s, switch_cpu, costs.switch_threads)
        if cpu > seconds:
            limit, seconds = top, cpu
    seconds += len(per_phase) * rtt
    return Projection(
        f"switch, {codec}", c.compute_s + seconds, float(total * frame), limit, cpu_total
    )


def _cpu_bound(
    c: Cluster, worker_cpu: float, switch_cpu: float, switch_threads: float = 1.0
) -> tuple[str, float]:
    """The longest CPU bound of a step on shared cores: all the CPU over the cores the
    job's processes can get, the busiest worker process, the busiest switch process (each
    at the share of a core a ready process gets)."""
    ranks = c.workers if c.rank_processes else 1  # threads of one process: one core at most
    processes = ranks + (c.switch_processes if switch_cpu else 0)
    cpu = {
        "cpu": (worker_cpu + switch_cpu) / min(c.cores, processes * c.share),
        "worker process": worker_cpu / ranks / c.share,
        # the busiest switch's share of every switch's packets (all of it: one switch), on
        # the cores its threads spread it over
        "switch process": switch_cpu
        * busiest_switch_absorbs(c)
        / switch_absorbs(c)
        / (c.share * switch_threads),
    }
    top = max(cpu, key=lambda k: cpu[k])
    return top, cpu[top]


def best_switch_step(cluster: Cluster, costs: Costs) -> Projection:
    """The faster of the switch's codecs for this density (what codec="auto" would pick)."""
    return min((switch_step(cluster, costs, k) for k in CODECS), key=lambda p: p.seconds)


def peer_wire_bytes(payload: float) -> float:
    """Bytes on the wire for `payload` bytes of TCP stream (1500-byte frames)."""
    return payload * (1 + TCP_FRAME_OVERHEAD / PEER_MTU_PAYLOAD)


def _peer_step(cluster: Cluster, costs: Costs, name: str, steps: int) -> Projection:
    """A peer all-reduce of the dense gradient in `steps` latency steps that moves
    2(W-1)/W of it in and out of every worker (ring and halving-doubling alike)."""
    c, w = cluster, cluster.workers
    if w == 1:
        return Projection(name, c.compute_s, 0.0, "nothing to reduce")
    payload = 2 * (w - 1) / w * BYTES_PER_ELEMENT * c.elements
    wire = peer_wire_bytes(payload)
    per_byte = {"link": wire / payload / c.link_bytes_per_s, "host": costs.peer_byte_s / c.share}
    limit = max(per_byte, key=lambda k: per_byte[k])
    seconds = payload * per_byte[limit]
    latency = (costs.call_s + steps * costs.alpha_s) / c.share
    if latency > seconds:
        limit = "latency"
    seconds += latency
    per_rank = costs.call_cpu_s + steps * costs.step_cpu_s + payload * costs.peer_cpu_byte_s
    cpu_total = w * per_rank
    cap = min(c.cores, w * c.share)  # the ranks share the cores (a process each)
    if c.cores and cpu_total / cap > seconds:
        limit, seconds = "cpu", cpu_total / cap
    return Projection(name, c.compute_s + seconds, wire, limit, cpu_total)


def ring_step(cluster: Cluster, costs: Costs) -> Projection:
    """Ring all-reduce (reduce-scatter, all-gather): 2(W-1) steps of n/W."""
    return _peer_step(cluster, costs, "ring all-reduce", 2 * (cluster.workers - 1))


def halving_doubling_step(cluster: Cluster, costs: Costs) -> Projection:
    """Recursive halving-doubling (the tree-shaped algorithms): 2 ceil(log2 W) steps."""
    steps = 2 * math.ceil(math.log2(cluster.workers)) if cluster.workers > 1 else 0
    return _peer_step(cluster, costs, "halving-doubling all-reduce", steps)


def project(cluster: Cluster, costs: Costs) -> dict[str, Projection]:
    """Every method for one cluster, by short name, and the switch's best codec."""
    out = {
        "switch_fixed_point": switch_step(cluster, costs, "fixed_point"),
        "switch_lossless": switch_step(cluster, costs, "lossless"),
        "ring": ring_step(cluster, costs),
        "halving_doubling": halving_doubling_step(cluster, costs),
    }
    out["switch"] = min(out["switch_fixed_point"], out["switch_lossless"], key=_secs)
    out["peer"] = min(out["ring"], out["halving_doubling"], key=_secs)
    return out


def _secs(p: Projection) -> float:
    return p.seconds


def speedup(cluster: Cluster, costs: Costs) -> float:
    """The best peer algorithm's step time over the switch's best codec's (> 1: the
    switch wins by that factor)."""
    p = project(cluster, costs)
    return p["peer"].seconds / p["switch"].seconds if p["switch"].seconds else math.inf
