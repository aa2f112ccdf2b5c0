"""codec="auto"'s per-step decision, measured both ways side by side: its measurement cells
(make run's NCF: three buckets, 13 int32 cells) in one MAX packet through the switch against
the MAX of the same cells over the process group (what every decision cost before; one
all_gather, as the hook agrees). Then whole auto steps of NCF's three buckets through the
switch (every bucket on its exact codec: the controller held there, deciding every step),
"gloo" (the decision's MAX on the hook's group, pipelined one step) against "switch" (its
packet), counting the process-group all_reduces per step.

W ranks as threads of this process, each with its agent (its UDP socket in its host's
namespace, through the target's switch) and its own gloo process group over loopback (the
ranks' one host: gloo's best case). Rounds alternate the two ways; in a round every rank
starts each call (or step) together (a thread barrier) and times its own. Writes
bench/results/auto_decision.md.

    python -m bench.auto_decision [--world 4] [--rounds 10] [--per-round 50]
        [--targets refswitch ebpf]
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

import numpy as np

from bench.agreement import (
    POOL_SIZE,
    gloo_hook_class,
    gloo_max,
    ncf_steps,
    open_agents,
    open_gloo,
    rounds_arguments,
    timed,
    ways_summary,
    ways_table,
)
from bench.publish import publish

WAYS = ("switch packet", "gloo MAX")  # gloo: the hook's MAX (one all_gather)
VARIANTS = {"gloo": False, "switch": True}  # name: the decision through the switch
BUCKETS = 3
BUDGETS = {0: 0.004, 1: 0.003, 2: 0.002}  # s: any; the held controller learns nothing


def decision_cells(world: int) -> list[np.ndarray]:
    """Every rank's cells of an NCF step's decision (costs, budgets, shares, wires, step)."""
    from homagg.worker.auto.measurements import Measurements, to_cells

    rng = np.random.default_rng(2)
    return [
        to_cells(
            Measurements(
                costs=rng.uniform(0.001, 0.03, BUCKETS),
                budgets=rng.uniform(0.001, 0.01, BUCKETS),
                nonzero=rng.uniform(0.0, 1.0, BUCKETS),
                wires=rng.uniform(0.0, 1.0, BUCKETS),
                iteration=0.05,
            ).pack()
        )
        for _ in range(world)
    ]


def switch_call(agent, cells: np.ndarray) -> None:
    """The decision's MAX packet through the switch."""
    from homagg.wire.constants import Op

    agent.transport.allreduce(Op.MAX, cells)


def gloo_call(pg, cells: np.ndarray) -> None:
    """The decision's MAX through the process group (int64, as the hook's: gloo_max)."""
    import torch

    gloo_max(pg, torch.from_numpy(cells.astype(np.int64)))


def auto_hooks(agents: list, groups: list, through_switch: bool) -> list:
    """Every rank's codec="auto" hook state, held on the exact switch codec (lossless),
    agreeing over its gloo group; its decision through the switch or not."""
    hook = gloo_hook_class()
    hooks = []
    for r, (a, g) in enumerate(zip(agents, groups, strict=True)):
        h = hook(
            a,
            "auto",
            world_size=len(agents),
            rank=r,
            codec_options={"lossless": {"support_block": 16}},
            switch_decisions=through_switch,
        )
        h.pg = g
        assert h.controller is not None
        h.controller.hold()  # every bucket on the switch, a decision every step
        for b in range(BUCKETS):  # NCF's exact codec: its tables are rows
            h.controller.bucket(b).exact = "lossless"
        hooks.append(h)
    return hooks


def measure(target: str, world: int, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Both ways on one switch, alternating round by round: seconds per call or step per
    rank, and each variant's process-group all_reduces and switch decisions per step."""
    from homagg.lab.controlled import Controlled

    c = Controlled(Path(tempfile.mkdtemp(prefix="bench-auto-")), world, True, target=target)
    agents: list = []
    try:
        job = c.create(world, pool_size=POOL_SIZE)
        agents = open_agents(c, job, world)
        groups = open_gloo(world)
        cells = decision_cells(world)
        calls = {
            WAYS[0]: [partial(switch_call, a, x) for a, x in zip(agents, cells, strict=True)],
            WAYS[1]: [partial(gloo_call, g, x) for g, x in zip(groups, cells, strict=True)],
        }
        for way in WAYS:  # warm up: the first packets, gloo's connections
            timed(calls[way], 5)
        out: dict[str, list[float]] = {w: [] for w in (*WAYS, *VARIANTS)}
        for i in range(rounds):
            for way in WAYS if i % 2 == 0 else WAYS[::-1]:
                out[way] += timed(calls[way], per_round)
        hooks = {v: auto_hooks(agents, groups, s) for v, s in VARIANTS.items()}
        for v in VARIANTS:  # warm up: the codecs, the first agreements
            ncf_steps(hooks[v], 3, BUDGETS)
        counted = {v: _counts(hooks[v]) for v in VARIANTS}
        steps = 0
        for i in range(rounds):
            for v in VARIANTS if i % 2 == 0 else list(VARIANTS)[::-1]:
                out[v] += ncf_steps(hooks[v], max(1, per_round // 10), BUDGETS)
            steps += max(1, per_round // 10)
        for v in VARIANTS:
            after = _counts(hooks[v])
            out[f"{v} per step"] = [(a - b) / steps for a, b in zip(after, counted[v])]
            out[f"{v} fallbacks"] = [float(sum(h.stats.fallbacks for h in hooks[v]))]
        for hs in hooks.values():
            for h in hs:
                h.close()
        return out
    finally:
        for a in agents:
            a.close()
        c.close()


def _counts(hooks: list) -> tuple[float, float, float]:
    """Rank 0's process-group all_reduces (agreements, decisions), switch decisions and
    verdicts so far."""
    s = hooks[0].stats
    return float(s.agreements), float(s.switch_decisions), float(s.switch_agreements)


def report(results: dict[str, dict[str, list[float]]], world: int, rounds: int) -> list[str]:
    """The markdown tables: each way's p50 and p99, each variant's step and counts."""
    lines = [
        "# codec=\"auto\"'s decision through the switch against the process group's",
        "",
        f"`python -m bench.auto_decision --world {world} --rounds {rounds}`: {world} ranks as "
        "threads of one process; the decision of an NCF step (3 buckets: 13 int32 cells), "
        "every rank's call started together and timed; the two ways alternate round by "
        "round. ms per call.",
        "",
        *ways_table(results, WAYS),
    ]
    lines += [
        "",
        "An auto step of NCF's three buckets through the switch (lossless; the controller "
        "held on the exact codec, so it decides every step): its decision over gloo "
        "(pipelined: waited for a step later) or through the switch; every rank's step "
        "timed, the variants alternating round by round. ms per step; per step, rank 0's "
        "process-group all_reduces (the seal and, over gloo, the decision), decisions "
        "through the switch and bucket verdicts through the switch:",
        "",
        "| target | decision | p50 | p99 | gloo / variant (p50) | steps | gloo all_reduces "
        "| switch decisions | switch verdicts | fallbacks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for target, ways in results.items():
        base50 = float(np.percentile(ways["gloo"], 50))
        for v in VARIANTS:
            ms = np.asarray(ways[v]) * 1e3
            p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
            gloo, decisions, verdicts = ways[f"{v} per step"]
            lines.append(
                f"| {target} | {v} | {p50:.1f} | {p99:.1f} | {base50 * 1e3 / p50:.2f}x "
                f"| {ms.size} | {gloo:.2f} | {decisions:.2f} | {verdicts:.2f} "
                f"| {int(ways[f'{v} fallbacks'][0])} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure on every available target and write bench/results/auto_decision.md."""
    args, targets = rounds_arguments("python -m bench.auto_decision", __doc__, "decisions", argv)
    results = {t: measure(t, args.world, args.rounds, args.per_round) for t in targets}
    publish(
        "auto_decision",
        report(results, args.world, args.rounds),
        summary=ways_summary(results, "decision", WAYS),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
