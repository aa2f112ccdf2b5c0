"""The switch beside what a user would pick instead (run/peers.py), W hosts, one network per
model: NCF with sparse embedding gradients over gloo (the default "DDP over gloo") and with
dense tables (gloo-dense); the dense MLP and the small transformer LM with fp16_compress_hook
and PowerSGD rank 1 and 4; each beside the switch, lossless and fixed point.

Per model and round: one `python -m run` with the lossless switch job, gloo and the peers,
and one with the fixed-point job alone; odd rounds reverse the two runs, reverse the peers'
order and run gloo and the peers before the switch job (`--peers-first`). Reported:
iteration time (median [p10, p90] over every step but each run's first, all rounds), bytes
sent per step against the dense gradient, and time to a target quality: the smoothed loss
DDP over gloo reaches at 80% of its steps in the same round, and the wall time (sum of
iteration times) each method needs to reach it (median over rounds, "-" if never); for the
switch runs, where the iteration's time goes (compute, and in the DDP hook: encode, wait on
the switch, decode, agreement) and the retransmissions per step.

    python -m bench.peers [--steps 30] [--rounds 2] [--models ncf,mlp,lm] [--bw MBIT]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.publish import heading, plot_path, publish, pyplot
from bench.runs import (
    RunFailed,
    RunSpec,
    ms,
    note_failure,
    pct,
    retransmissions,
    run_once,
    smoothed,
    split_cell,
    time_split,
    time_to,
)
from homagg.lab.switch_process import AUTO_TARGET, TARGETS

PEERS_OF = {
    "ncf": ["gloo-dense"],
    "mlp": ["gloo-fp16", "gloo-powersgd1", "gloo-powersgd4"],
    "lm": ["gloo-fp16", "gloo-powersgd1", "gloo-powersgd4"],
}
DESCRIPTION = {
    "ncf": "NCF (sparse embeddings)",
    "mlp": "MLP (dense)",
    "lm": "transformer LM (dense)",
}
SWITCH = ("switch, lossless", "switch, fixed_point")
TARGET_AT = 0.8  # the target: gloo's smoothed loss at this fraction of its steps


def target_of(gloo: list[dict[str, Any]]) -> float:
    """The round's target loss: DDP over gloo's smoothed loss at TARGET_AT of its steps."""
    curve = smoothed([s["loss"] for s in gloo])
    return curve[max(0, round(TARGET_AT * len(curve)) - 1)]


class Tally:
    """Samples per (model, method): iteration seconds, wire/dense ratios, time to target."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], list[float]] = {}
        self.wire: dict[tuple[str, str], list[float]] = {}
        self.reach: dict[tuple[str, str], list[tuple[float, int] | None]] = {}
        self.final: dict[tuple[str, str], list[float]] = {}
        self.fallback: dict[tuple[str, str], int] = {}
        self.timed: dict[tuple[str, str], list[dict[str, Any]]] = {}  # every step but firsts

    def add(self, model: str, runs: dict[str, list[dict[str, Any]]], target: float) -> None:
        """One run's methods, judged against the round's target."""
        for name, steps in runs.items():
            key = (model, name)
            self.seconds.setdefault(key, []).extend(s["seconds"] for s in steps[1:])
            self.wire.setdefault(key, []).extend(s["tx_bytes"] / s["dense_bytes"] for s in steps)
            self.reach.setdefault(key, []).append(time_to(steps, target))
            self.final.setdefault(key, []).append(smoothed([s["loss"] for s in steps])[-1])
            fell = sum(s.get("fallback_buckets", 0) for s in steps)
            self.fallback[key] = self.fallback.get(key, 0) + fell
            self.timed.setdefault(key, []).extend(steps[1:])

    def waiting(self, model: str, name: str) -> float:
        """The share of the mean iteration the DDP hook spent waiting on the switch."""
        split = time_split(self.timed[(model, name)])
        return split["wait"] / sum(split.values()) if sum(split.values()) else 0.0


def _one_round(model: str, rnd: int, args: argparse.Namespace, tmp: Path, tally: Tally) -> str:
    """The lossless run (with gloo and the peers) and the fixed-point run, alternated."""
    peers = PEERS_OF[model][:: -1 if rnd % 2 else 1]
    first = bool(rnd % 2)  # odd rounds: gloo and the peers before the switch
    specs = [
        RunSpec(model, "lossless", args.hosts, args.bw, args.steps, True, peers, args.target),
        RunSpec(model, "fixed_point", args.hosts, args.bw, args.steps, False, [], args.target),
    ]
    for spec in specs:
        spec.peers_first = first
    if rnd % 2:
        specs.reverse()
    got: dict[str, list[dict[str, Any]]] = {}
    target_used = args.target
    for spec in specs:
        print(
            f"  round {rnd + 1}: {model} {spec.codec} +{'gloo,' if spec.gloo else ''}"
            f"{','.join(spec.peers)}",
            flush=True,
        )
        t0 = time.perf_counter()
        try:
            runs, target_used = run_once(spec, tmp / f"{model}-{spec.codec}-{rnd}")
        except RunFailed as exc:
            note_failure(args.failed, f"{model}, round {rnd + 1}, {spec.codec}", exc)
            continue
        got.update(runs)
        print(
            f"    {time.perf_counter() - t0:.0f} s: "
            + ", ".join(
                f"{n} {statistics.median(s['seconds'] for s in r[1:]) * 1e3:.0f} ms"
                for n, r in runs.items()
            ),
            flush=True,
        )
    if "DDP over gloo" not in got:  # its run failed: this round has no reference
        return target_used
    tally.add(model, got, target_of(got["DDP over gloo"]))
    return target_used


def _reach_cell(samples: list[tuple[float, int] | None]) -> str:
    """Median wall seconds and steps to the target over the rounds that reached it."""
    hit = [s for s in samples if s is not None]
    if not hit:
        return f"- (0/{len(samples)})"
    secs = statistics.median(s[0] for s in hit)
    steps = statistics.median(s[1] for s in hit)
    return f"{secs:.1f} s, {steps:.0f} steps ({len(hit)}/{len(samples)})"


def _switch_cells(m: str, name: str, hosts: int, tally: Tally) -> str:
    """The switch columns: buckets via gloo, where the time goes, waiting share, retx."""
    if name not in SWITCH:
        return "- | - | - | -"
    timed = tally.timed[(m, name)]
    retx, share = retransmissions(timed, hosts)
    return (
        f"{tally.fallback[(m, name)]} | {split_cell(time_split(timed))} "
        f"| {tally.waiting(m, name):.0%} | {retx:.1f} ({share:.0%})"
    )


def present(m: str, tally: Tally) -> list[str]:
    """Model m's methods that ran at least once (a failed run leaves its row out), gloo
    first; none when gloo never ran (nothing to compare with)."""
    names = [n for n in ("DDP over gloo", *PEERS_OF[m], *SWITCH) if (m, n) in tally.seconds]
    return names if names and names[0] == "DDP over gloo" else []


def table(models: list[str], tally: Tally, hosts: int = 4) -> list[str]:
    """The markdown rows: per model, gloo, the peers and the switch."""
    lines = [
        "| model | method | ms/iteration | gloo / method | wire vs dense | final loss "
        "| to target (wall, steps, rounds reached) | buckets via gloo "
        "| compute + hook ms (encode, wait, decode, agreement) | waiting on the switch "
        "| retransmissions per step (share of packets) |",
        "|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    for m in (m for m in models if present(m, tally)):
        gloo = statistics.median(tally.seconds[(m, "DDP over gloo")])
        for name in present(m, tally):
            s = tally.seconds[(m, name)]
            lines.append(
                f"| {DESCRIPTION[m]} | {name} | {ms(s)} | {gloo / statistics.median(s):.2f}x "
                f"| {statistics.mean(tally.wire[(m, name)]):.2f}x "
                f"| {statistics.median(tally.final[(m, name)]):.4f} "
                f"| {_reach_cell(tally.reach[(m, name)])} "
                f"| {_switch_cells(m, name, hosts, tally)} |"
            )
    return lines


def plot(models: list[str], tally: Tally, title: str, path: Path) -> None:
    """Per model, the median iteration time of each method (bars, p10-p90 whiskers)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), squeeze=False)
    for ax, m in zip(axes[0], models):
        names = present(m, tally)
        s = [tally.seconds[(m, n)] for n in names]
        med = [statistics.median(x) * 1e3 for x in s]
        err = [
            [med[i] - pct(x, 0.1) * 1e3 for i, x in enumerate(s)],
            [pct(x, 0.9) * 1e3 - med[i] for i, x in enumerate(s)],
        ]
        colors = [
            "0.4" if n.startswith("DDP") else "tab:olive" if n in PEERS_OF[m] else "tab:green"
            for n in names
        ]
        ax.bar(range(len(names)), med, yerr=err, capsize=3, color=colors)
        ax.set_xticks(
            range(len(names)),
            [n.replace("switch, ", "sw ") for n in names],
            rotation=35,
            ha="right",
            fontsize=8,
        )
        ax.set_title(DESCRIPTION[m], fontsize=9)
        ax.set_ylabel("ms per iteration")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_of(models: list[str], tally: Tally, hosts: int = 4) -> str:
    """One line: per model, the fastest method to the target, the switch's time, and the
    share of the switch's iteration spent waiting on it with its retransmissions."""
    parts = []
    for m in models:
        times = {}
        for name in present(m, tally):
            hit = [s[0] for s in tally.reach[(m, name)] if s is not None]
            if hit:
                times[name] = statistics.median(hit)
        if not times or (m, "switch, lossless") not in tally.seconds:
            parts.append(f"{m}: no comparison (runs failed)")
            continue
        best = min(times, key=lambda n: times[n])
        sw = times.get("switch, lossless")
        retx, _ = retransmissions(tally.timed[(m, "switch, lossless")], hosts)
        parts.append(
            f"{m}: fastest to target {best} {times[best]:.1f} s, switch lossless "
            + (f"{sw:.1f} s" if sw is not None else "not reached")
            + f" (waiting on the switch {tally.waiting(m, 'switch, lossless'):.0%} of its "
            f"iteration, {retx:.1f} retransmissions per step)"
        )
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, write bench/results/peers.md and peers.png."""
    p = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
    )
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--rounds", type=int, default=2, help="repetitions (default 2)")
    p.add_argument("--hosts", type=int, default=4, help="worker hosts W (default 4)")
    p.add_argument("--models", default="ncf,mlp,lm", help="comma-separated: ncf, mlp, lm")
    p.add_argument("--bw", type=float, default=0.0, help="link Mbit/s, htb (default unshaped)")
    p.add_argument("--target", default=AUTO_TARGET, choices=[AUTO_TARGET, *TARGETS])
    p.add_argument("--name", default="peers", help="results file stem (default peers)")
    args = p.parse_args(argv)
    args.failed = []  # runs that failed (note_failure), listed under the tables
    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in PEERS_OF for m in models):
        p.error(f"--models takes a comma-separated list of {', '.join(PEERS_OF)}")
    start, tally = time.perf_counter(), Tally()
    with tempfile.TemporaryDirectory(prefix="homagg-bench-peers-") as tmp:
        for rnd in range(args.rounds):
            for i, m in enumerate(models):
                target_used = _one_round(m, rnd, args, Path(tmp), tally)
                done = models if rnd else models[: i + 1]  # written as it goes: runs are long
                write(args, done, tally, target_used, time.perf_counter() - start, rnd + 1)
    return 0


def write(
    args: argparse.Namespace,
    models: list[str],
    tally: Tally,
    target_used: str,
    seconds: float,
    rounds: int,
) -> None:
    """bench/results/<name>.md and .png from the rounds so far."""
    links = f"{args.bw:g} Mbit/s htb" if args.bw else "unshaped"
    title = f"W={args.hosts}, {target_used}, links {links}"
    lines = [
        heading("The switch beside the peer methods"),
        "",
        f"`python -m bench.peers --steps {args.steps} --rounds {args.rounds} --models "
        f"{','.join(models)}{f' --bw {args.bw:g}' if args.bw else ''}`; {rounds} round(s) in "
        f"{seconds:.0f} s; {title}. Iteration time: median [p10, p90] over every step but each "
        "run's first, all rounds. Wire: bytes each host sent per step (mean over the ranks; "
        "everything) / dense float32 gradient bytes. Target: the smoothed (5-step mean) loss "
        f"DDP over gloo reaches at {TARGET_AT:.0%} of its steps in the same round; time to "
        "target: the wall time of the steps until a method's smoothed loss reaches it "
        "(median over the rounds that reached it). Buckets via gloo: the switch runs' "
        "buckets that went to the process group's all_reduce instead (a fallback), all "
        "ranks and steps. Compute + hook: mean ms per iteration outside the hook's switch "
        "work (forward, backward, optimizer) and in it: the codec's encoding and decoding, "
        "the wait on the switch (sending, results, retransmissions) and the ranks' agreement "
        "all_reduces; waiting on the switch: that wait's share of the mean iteration. "
        "Retransmissions: all ranks, per step, and their share of the aggregation packets.",
        "",
        *table(models, tally, args.hosts),
        "",
        f"![peer methods]({args.name}.png)",
        "",
    ]
    summary = f"peers W={args.hosts} ({target_used}, {links}): " + summary_of(
        models, tally, args.hosts
    )
    plot(models, tally, title, plot_path(f"{args.name}.png"))
    publish(args.name, [*lines, f"Summary: {summary}.", ""], summary, args.failed)


if __name__ == "__main__":
    sys.exit(main())
