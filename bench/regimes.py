"""Regimes where the network, not the hosts, may be the limit: every link shaped to a rate
(htb, `python -m run --bw`) beside unshaped links at W = 4, and scaling W = 2, 4, 8; DDP over
gloo beside the switch, lossless and 32-bit fixed point, on one model.

Per regime and round: one `python -m run` with the lossless switch job and its gloo twin,
and one with the fixed-point job alone; rounds alternate the two (and whether gloo runs
before or after the switch). Iteration time: median [p10, p90] over every step but each
run's first; bytes per worker: what each host sent per step, everything included. Ring
all-reduce sends 2(W-1)/W of the gradient per worker, the switch one copy up (and one comes
down): the plot draws both lines beside the measurement.

    python -m bench.regimes [--model mlp] [--steps 12] [--rounds 1] [--bws 100,1000]
                            [--hosts 2,4,8] [--codecs lossless,fixed_point] [--name regimes]
                            [--target auto|present|TARGET]

`--target present` (make bench): the default target's regimes in <name>.md, then the eBPF
target's in <name>_ebpf.md where the kernel allows it.
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
from bench.runs import RunFailed, RunSpec, ms, note_failure, pct, run_once
from homagg.lab.switch_process import AUTO_TARGET, PRESENT_TARGETS, TARGETS, present_targets

METHODS = ("DDP over gloo", "switch, lossless", "switch, fixed_point")
Key = tuple[int, float, str]  # (W, link Mbit/s or 0 for unshaped, method)


class Samples:
    """Per (W, link, method): iteration seconds and bytes sent per step per worker."""

    def __init__(self) -> None:
        self.seconds: dict[Key, list[float]] = {}
        self.sent: dict[Key, list[float]] = {}
        self.dense: dict[Key, float] = {}

    def add(self, hosts: int, bw: float, runs: dict[str, list[dict[str, Any]]]) -> None:
        """One run's methods."""
        for name, steps in runs.items():
            key = (hosts, bw, name)
            self.seconds.setdefault(key, []).extend(s["seconds"] for s in steps[1:])
            self.sent.setdefault(key, []).extend(s["tx_bytes"] for s in steps[1:])
            self.dense[key] = steps[0]["dense_bytes"]


def regime(
    hosts: int, bw: float, rnd: int, args: argparse.Namespace, tmp: Path, got: Samples
) -> str:
    """The first codec's run with its gloo twin, then the other codecs' runs; every other
    round the order reversed and gloo run before the switch."""
    codecs = [c for c in args.codecs.split(",") if c]
    specs = [  # the first codec's run also runs its gloo twin
        RunSpec(args.model, c, hosts, bw, args.steps, i == 0, [], args.target)
        for i, c in enumerate(codecs)
    ]
    for spec in specs:
        spec.peers_first = bool(rnd % 2)
    if rnd % 2:
        specs.reverse()
    target = args.target
    for spec in specs:
        t0 = time.perf_counter()
        try:
            runs, target = run_once(spec, tmp / f"{hosts}-{bw:g}-{spec.codec}-{rnd}")
        except RunFailed as exc:
            note_failure(
                args.failed, f"W={hosts}, {bw:g} Mbit/s, {spec.codec}, round {rnd + 1}", exc
            )
            continue
        got.add(hosts, bw, runs)
        print(
            f"  W={hosts} links {f'{bw:g} Mbit/s' if bw else 'unshaped'} {spec.codec}: "
            f"{time.perf_counter() - t0:.0f} s, "
            + ", ".join(
                f"{n} {statistics.median(s['seconds'] for s in r[1:]) * 1e3:.0f} ms"
                for n, r in runs.items()
            ),
            flush=True,
        )
    return target


def rows(got: Samples, cells: list[tuple[int, float]]) -> list[str]:
    """Markdown rows per (W, link) and method."""
    lines = [
        "| W | links | method | ms/iteration | gloo / method | kB sent per worker and step "
        "| vs dense gradient | ring 2(W-1)/W |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for hosts, bw in cells:
        gloo = got.seconds.get((hosts, bw, "DDP over gloo"))
        for name in METHODS:
            key = (hosts, bw, name)
            if key not in got.seconds:
                continue
            s, sent = got.seconds[key], statistics.median(got.sent[key])
            ratio = f"{statistics.median(gloo) / statistics.median(s):.2f}x" if gloo else "-"
            lines.append(
                f"| {hosts} | {f'{bw:g} Mbit/s' if bw else 'unshaped'} | {name} | {ms(s)} "
                f"| {ratio} | {sent / 1e3:.0f} | {sent / got.dense[key]:.2f}x "
                f"| {2 * (hosts - 1) / hosts:.2f}x |"
            )
    return lines


def plot(got: Samples, hosts: list[int], path: Path, title: str) -> None:
    """Iteration time and bytes per worker against W (unshaped links), with the ring's and
    the switch's bytes drawn from the dense gradient size."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    colors = {"DDP over gloo": "0.3", "switch, lossless": "tab:green"}
    colors["switch, fixed_point"] = "tab:blue"
    for name, color in colors.items():
        ws = [w for w in hosts if (w, 0.0, name) in got.seconds]
        if not ws:
            continue
        s = [got.seconds[(w, 0.0, name)] for w in ws]
        med = [statistics.median(x) * 1e3 for x in s]
        err = [
            [m - pct(x, 0.1) * 1e3 for m, x in zip(med, s)],
            [pct(x, 0.9) * 1e3 - m for m, x in zip(med, s)],
        ]
        a1.errorbar(ws, med, yerr=err, marker="o", capsize=3, color=color, label=name)
        sent = [statistics.median(got.sent[(w, 0.0, name)]) / 1e3 for w in ws]
        a2.plot(ws, sent, marker="o", color=color, label=name)
    dense = next(iter(got.dense.values())) / 1e3
    a2.plot(hosts, [2 * (w - 1) / w * dense for w in hosts], "k--", lw=1, label="ring 2(W-1)/W")
    a2.plot(hosts, [dense] * len(hosts), "k:", lw=1, label="one copy (switch)")
    for ax, label in ((a1, "ms per iteration"), (a2, "kB sent per worker and step")):
        ax.set_xlabel("W (worker hosts)")
        ax.set_xticks(hosts)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    a2.legend(fontsize=7)
    a1.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.regimes",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
    )
    p.add_argument("--model", default="mlp", choices=["ncf", "mlp", "lm"], help="default mlp")
    p.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    p.add_argument("--rounds", type=int, default=1, help="repetitions (default 1)")
    p.add_argument("--bws", default="100,1000", help="shaped link rates in Mbit/s at W=4")
    p.add_argument("--hosts", default="2,4,8", help="W values for the scaling (unshaped)")
    p.add_argument(
        "--codecs",
        default="lossless,fixed_point",
        help="switch codecs; the first one's run also runs DDP over gloo",
    )
    p.add_argument(
        "--target",
        default=AUTO_TARGET,
        choices=[AUTO_TARGET, PRESENT_TARGETS, *TARGETS],
        help="the switch target (default auto); present: auto's, then ebpf where allowed",
    )
    p.add_argument("--name", default="regimes", help="results file stem (default regimes)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the regimes, write bench/results/regimes.md and regimes.png (with --target
    present, one file per target: the eBPF target's named <name>_ebpf)."""
    args = _parser().parse_args(argv)
    if args.target != PRESENT_TARGETS:
        run_regimes(args)
        return 0
    name = args.name
    for i, target in enumerate(present_targets()):
        args.target, args.name = target, name if i == 0 else f"{name}_{target}"
        run_regimes(args)
    return 0


def run_regimes(args: argparse.Namespace) -> None:
    """Every regime of args on args.target, rounds alternating; written as it goes."""
    args.failed = []  # runs that failed (note_failure), listed under the tables
    hosts = sorted({int(x) for x in args.hosts.split(",") if x})
    bws = [float(x) for x in args.bws.split(",") if x]
    # the shaped links first (W = 4, beside unshaped), then the other W
    cells = [(4, 0.0), *((4, bw) for bw in bws), *((w, 0.0) for w in hosts if w != 4)]
    start, got = time.perf_counter(), Samples()
    with tempfile.TemporaryDirectory(prefix="homagg-bench-regimes-") as tmp:
        for rnd in range(args.rounds):
            for i, (w, bw) in enumerate(cells):
                target = regime(w, bw, rnd, args, Path(tmp), got)
                done = cells if rnd else cells[: i + 1]  # written as it goes: runs are long
                write(args, done, got, target, time.perf_counter() - start, rnd + 1)


def write(
    args: argparse.Namespace,
    cells: list[tuple[int, float]],
    got: Samples,
    target: str,
    seconds: float,
    rounds: int,
) -> None:
    """bench/results/regimes.md and regimes.png from the cells measured so far."""
    hosts = sorted({w for w, bw in cells if not bw})
    title = f"{args.model}, {target}, unshaped links"
    lines = [
        heading("Regimes: link rate and W"),
        "",
        f"`python -m bench.regimes --model {args.model} --steps {args.steps} --rounds "
        f"{args.rounds} --bws {args.bws} --hosts {args.hosts} --codecs {args.codecs}`; "
        f"{rounds} round(s) in {seconds:.0f} s; switch {target}. Iteration time: median "
        f"[p10, p90] over {rounds} x {args.steps - 1} steps per cell. Sent: median bytes "
        "each host sent per step, everything included (aggregation, gloo, control).",
        "",
        *rows(got, cells),
        "",
        f"![iteration time and bytes per worker against W]({args.name}.png)",
        "",
    ]
    if hosts:
        plot(got, hosts, plot_path(f"{args.name}.png"), title)
    publish(args.name, lines, failed=args.failed)


if __name__ == "__main__":
    sys.exit(main())
