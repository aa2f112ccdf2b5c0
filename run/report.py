"""The end of `make run` (print_report): the summary table, the switch counters, the
parameter comparison against the fixed-point bound, and the PNG plot of loss, iteration
time and the switch's packet rate of the runs; for a --script (print_script_report) what
the lab measures from outside."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from homagg.worker.codecs import is_exact

if TYPE_CHECKING:
    from run.net import Topology
    from run.script import Traffic


SUMMARY_HEAD = (
    "\nsummary: means over the ranks (the step lines above are rank 0's own), RETX and "
    "FALLBACK BUCKETS summed over the ranks; wire = bytes each host sent per step, "
    "everything included; dense = the model's float32 gradients; CPU = every rank's process "
    "(all its threads) per step, summed: on one machine a step lasts at least CPU / its cores"
)


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The per-step records rank 0 wrote."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fixed_point_bound(steps: list[dict[str, Any]], world_size: int, lr: float) -> float:
    """First-order bound on |switch - gloo| of any parameter after the run (docs/codecs.md):
    per step the averaged gradient is off by at most 2^(E-P-1) + ulp, with E the exponent of
    the largest |local gradient| and P = 31 - ceil(log2 W); SGD scales it by lr, plus one
    float32 rounding of the update. It ignores the feedback of parameter differences into
    later gradients (exact for the rows a step touches only once)."""
    p = 31 - math.ceil(math.log2(world_size))
    total = 0.0
    for s in steps:
        e = math.frexp(s["grad_max"])[1] if s["grad_max"] > 0 else -126
        total += lr * (2.0 ** (e - p - 1) + 2.0 ** (e - 24)) + 2.0 ** (
            math.frexp(s["param_max"])[1] - 24
        )
    return total


def verdict(diff: float, bound: float, steps: int) -> tuple[bool, str]:
    """Whether the switch run's parameters agree with gloo's (max |difference| `diff`) within
    the fixed-point bound, and the verdict to print: it names the bound first-order, a check
    for short runs (the rounding differences' feedback through later gradients is left out,
    so a long run may pass it without a fault: docs/run.md, "The parameter check")."""
    ok = diff <= bound
    what = "AGREE within the bound" if ok else "DIFFER beyond the bound"
    return ok, (
        f"first-order fixed-point bound {bound:.3g} (for short runs: {steps} steps here; "
        f"docs/run.md): {what}"
    )


def compare(switch_pt: Path, gloo_pt: Path) -> float:
    """Max |difference| over every parameter and buffer of the two runs' final models; equal
    entries differ by 0, so an infinity both hold (the LM's causal mask, -inf above the
    diagonal) is no NaN, while a NaN in either still makes the result NaN (DIFFER)."""
    a, b = torch.load(switch_pt), torch.load(gloo_pt)
    diffs = [float(torch.where(a[k] == b[k], 0.0, (a[k] - b[k]).abs()).max()) for k in a]
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs)  # max() skips a NaN


def _row(name: str, steps: list[dict[str, Any]]) -> list[str]:
    secs = [s["seconds"] for s in steps[1:]] or [steps[0]["seconds"]]
    cpu = [s["cpu_seconds"] for s in steps[1:] or steps[:1] if "cpu_seconds" in s]
    wire = statistics.mean(s["tx_bytes"] for s in steps)
    dense = steps[0]["dense_bytes"]
    retx = sum(s.get("retransmissions", 0) for s in steps)
    fb = sum(s.get("fallback_buckets", 0) for s in steps)
    return [
        name,
        str(len(steps)),
        f"{steps[0]['loss']:.4f}",
        f"{steps[-1]['loss']:.4f}",
        f"{statistics.median(secs) * 1e3:.1f}",
        f"{sum(s['seconds'] for s in steps):.1f}",
        f"{statistics.median(cpu) * 1e3:.1f}" if cpu else "-",
        f"{wire / 1e3:.1f}",
        f"{wire / dense:.2f}x",
        str(retx),
        str(fb),
    ]


def overlap_summary(steps: list[dict[str, Any]], out: Path | None = None) -> str:
    """codec="auto"'s choices (bucket-steps per codec) and whether every rank decided alike
    (the ranks' auto-rank<r>.json in `out`), and DeAR's tuned bucket size with the agreed
    iteration time of each size it tried, from the switch run's last record; empty when
    neither was used."""
    last = steps[-1]
    lines = []
    if "auto_choices" in last:
        total = sum(last["auto_choices"].values()) or 1
        shares = sorted(last["auto_choices"].items(), key=lambda kv: -kv[1])
        lines.append(
            "auto codec choices (bucket-steps): "
            + ", ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in shares)
            + (
                f"; {last['leased_steps']} steps held on the host path without an agreement"
                if last.get("leased_steps")
                else ""
            )
        )
        histories = [p.read_text() for p in sorted(out.glob("auto-rank*.json"))] if out else []
        if histories:
            alike = all(h == histories[0] for h in histories)
            lines.append(
                f"auto decisions of {len(json.loads(histories[0]))} steps on "
                f"{len(histories)} ranks: " + ("alike on every rank" if alike else "DIFFERENT")
            )
    if "dear_bucket_bytes" in last:
        state = "tuned" if last.get("dear_tuned") else "still tuning"
        tried = last.get("dear_tuning", {})
        sizes = ", ".join(f"{int(k) // 1024} KiB {v * 1e3:.0f} ms" for k, v in tried.items())
        lines.append(
            f"DeAR bucket size: {last['dear_bucket_bytes'] / 1024:.0f} KiB ({state}"
            + (f"; iteration by size: {sizes}" if sizes else "")
            + ")"
        )
    return "\n".join(lines)


def summary_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """One line per run: losses, median iteration time, bytes per rank and step vs dense."""
    head = [
        "RUN",
        "STEPS",
        "LOSS FIRST",
        "LOSS LAST",
        "MEDIAN ITER ms",
        "TOTAL s",
        "CPU ms/STEP",
        "WIRE kB/RANK/STEP",
        "VS DENSE",
        "RETX",
        "FALLBACK BUCKETS",
    ]
    rows = [head] + [_row(name, steps) for name, steps in runs.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def packet_rate(step: dict[str, Any]) -> float:
    """The switch's packets per second in a step: every rank's contributions and the results
    it sent them (run/train.py's switch_packets) over the step's mean iteration time."""
    return step.get("switch_packets", 0) / step["seconds"] if step["seconds"] > 0 else 0.0


def plot(runs: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """Loss, iteration time and the switch's packet rate per step of each run, side by side,
    as a PNG (the rate of the runs that went through the switch only)."""
    from homagg.lab.plotting import pyplot

    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4))
    for name, steps in runs.items():
        x = [s["step"] + 1 for s in steps]
        ax1.plot(x, [s["loss"] for s in steps], label=name)
        ax2.plot(x, [s["seconds"] * 1e3 for s in steps], label=name)
        if any(s.get("switch_packets") for s in steps):
            ax3.plot(x, [packet_rate(s) for s in steps], label=name)
    ax1.set(xlabel="step", ylabel="training loss", title="loss")
    ax2.set(xlabel="step", ylabel="iteration time (ms)", title="iteration time", yscale="log")
    ax3.set(
        xlabel="step",
        ylabel="packets/s (contributions + results)",
        title="switch packet rate",
    )
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(args: argparse.Namespace, topo: Topology, target: str, counters: str) -> int:
    """Print the summary table, the switch counters and the parameter check, and write the
    plot; 0 when the switch and gloo runs' parameters agree (or were not compared)."""
    switch_run = f"switch ({args.codec}, {args.overlap}, {target})"
    runs = {switch_run: read_steps(args.out / "switch.jsonl")}
    if not args.no_gloo:
        runs["DDP over gloo"] = read_steps(args.out / "gloo.jsonl")
    for peer in args.peer_list:
        runs[peer] = read_steps(args.out / f"{peer}.jsonl")
    print(SUMMARY_HEAD)
    print(summary_table(runs))
    overlap = overlap_summary(runs[switch_run], args.out)
    if overlap:
        print(overlap)
    print("\nswitch counters (aggctl counters)\n" + counters.strip())
    ok = args.no_gloo or _parameters_agree(args, runs[switch_run], topo.hosts)
    if args.no_plot:
        print("plot: none (--no-plot)")
    else:
        path = args.out / "make-run.png"
        plot(runs, path, f"{topo.hosts} hosts, {target}, {topo.describe_bw()}")
        print(f"plot: {path}")
    return 0 if ok else 1


def _parameters_agree(args: argparse.Namespace, steps: list[dict[str, Any]], hosts: int) -> bool:
    """Print the switch vs gloo parameter difference; an exact codec's must be within the
    fixed-point bound (a lossy codec's has none: True)."""
    diff = compare(args.out / "switch.pt", args.out / "gloo.pt")
    head = f"\nfinal parameters, switch vs gloo: max |difference| {diff:.3g}"
    if not is_exact(args.codec):
        print(f"{head} ({args.codec} is lossy: no bound)")
        return True
    bound = fixed_point_bound(steps, hosts, args.lr)
    ok, text = verdict(diff, bound, len(steps))
    print(f"{head}, {text}")
    return ok


SCRIPT_SUMMARY_HEAD = (
    "\nsummary of your script (its step times and losses are its own output above; measured "
    "from outside: WALL s = torchrun's start to the last rank's exit, set-up included; "
    "WIRE = bytes each host sent, mean over the hosts, everything included)"
)


def script_summary_table(runs: dict[str, Traffic]) -> str:
    """One line per run of a --script: wall time, bytes a host sent in all and per second."""
    head = ("RUN", "WALL s", "WIRE MB/HOST", "WIRE MB/s/HOST")
    rows = [head] + [
        (
            name,
            f"{t.seconds:.1f}",
            f"{t.bytes_per_host() / 1e6:.2f}",
            f"{t.bytes_per_host() / t.seconds / 1e6:.3f}" if t.seconds > 0 else "-",
        )
        for name, t in runs.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def plot_traffic(runs: dict[str, Traffic], path: Path, title: str) -> None:
    """A --script's runs as a PNG: the bytes a host sent per second over each run's wall
    time, and the wall times side by side."""
    from homagg.lab.plotting import pyplot

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, traffic in runs.items():
        xs, ys = traffic.rate()
        ax1.plot(xs, [y / 1e6 for y in ys], label=name)
    ax1.set(xlabel="seconds since torchrun started", ylabel="MB/s a host sent (mean)")
    ax1.set(title="bytes on the wire")
    ax1.grid(alpha=0.3)
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend()
    ax2.bar(list(runs), [t.seconds for t in runs.values()])
    ax2.set(ylabel="seconds", title="wall time (set-up included)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_script_report(
    args: argparse.Namespace,
    topo: Topology,
    target: str,
    counters: str,
    traffic: dict[str, Traffic],
) -> int:
    """The summary of a --script's runs (what the lab measures from outside), the switch
    counters and the plot; 0 (the script's own results are its own: not compared)."""
    names = {"switch": f"switch ({args.codec}, {target})", "gloo": "DDP over gloo"}
    runs = {names.get(mode, mode): t for mode, t in traffic.items()}
    print(SCRIPT_SUMMARY_HEAD)
    print(script_summary_table(runs))
    print("\nswitch counters (aggctl counters)\n" + counters.strip())
    path = args.out / "make-run.png"
    plot_traffic(runs, path, f"{args.script.name}: {topo.hosts} hosts, {target}")
    print(f"plot: {path}\nyour script's files: {args.out}/switch, {args.out}/gloo")
    return 0
