"""Convergence with low-bit lanes: training loss of the dense MLP of `make run` and of a
small transformer, W workers, exact sum (what DDP over gloo computes) vs 32-bit fixed
point vs 16- and 8-bit lanes (with and without error feedback, 8-bit also rotated).

The W workers run in this process: each computes its gradient on its own batch, the
codecs' phases are combined with the switch's exact semantics (`simulate`, bit for bit
what the reference switch and BMv2 return: tests/worker/test_lowbit_switch.py) and every
worker applies the same averaged gradient with SGD, as DDP does.

With `--switch bmv2` (or refswitch; needs root) it also times one step's aggregation of
each model's gradient through that switch (W worker threads in namespaces, as
bench.aggregation) against a gloo all_reduce of the same tensor, methods alternating.

    python -m bench.lowbit [--steps 300] [--world 4] [--models mlp,transformer]
                           [--switch bmv2] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from bench.publish import plot_path, publish, pyplot
from run.model import JobShape, make_task
from worker.codecs import ErrorFeedback, FixedPoint, LowBit, simulate

LAST = 20  # steps averaged for the final loss


def _codecs(world: int) -> dict[str, Callable[[], list] | None]:
    """Run name -> a maker of the W codecs (None: the exact sum, as gloo)."""

    def lowbit(bits: int, gamma: float | None, rotate: bool = False):
        def make():
            out = []
            for r in range(world):
                c = LowBit(world, bits=bits, seed=r, rotate=rotate)
                out.append(c if gamma is None else ErrorFeedback(c, gamma=gamma))
            return out

        return make

    return {
        "exact sum (gloo)": None,
        "fixed point 32-bit": lambda: [FixedPoint(world) for _ in range(world)],
        "16-bit lanes + EF": lowbit(16, 0.9),
        "16-bit lanes, no EF": lowbit(16, None),
        "8-bit lanes + EF": lowbit(8, 0.9),
        "8-bit lanes, no EF": lowbit(8, None),
        "8-bit lanes + EF, rotated": lowbit(8, 0.9, rotate=True),
    }


class TinyTransformer(nn.Module):
    """A small transformer classifier: 16 tokens of a 64-symbol vocabulary, 2 encoder
    layers of width 64, 4 heads; the class is which of 10 hidden patterns the sequence
    is noisily drawn from."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 64)
        self.pos = nn.Parameter(torch.randn(16, 64) * 0.1)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.head(self.encoder(self.embed(tokens) + self.pos).mean(dim=1))


def _transformer_task() -> tuple[nn.Module, Callable, Callable]:
    torch.manual_seed(0)
    patterns = torch.randint(0, 64, (10, 16), generator=torch.Generator().manual_seed(7))

    def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(rank * 10_007 + step)
        labels = torch.randint(0, 10, (32,), generator=g)
        tokens = patterns[labels].clone()
        noise = torch.rand(tokens.shape, generator=g) < 0.5
        tokens[noise] = torch.randint(0, 64, (int(noise.sum()),), generator=g)
        return tokens, labels

    return TinyTransformer(), batch, nn.functional.cross_entropy


def _task(model: str) -> tuple[nn.Module, Callable, Callable, float]:
    if model == "transformer":
        return (*_transformer_task(), 0.05)
    task = make_task("mlp", JobShape())
    return task.model, task.batch, task.loss, 0.1


def train(model_name: str, make, world: int, steps: int) -> list[float]:
    """Mean training loss over the workers, per step, with the codec's aggregate."""
    model, batch, loss_fn, lr = _task(model_name)
    params = [p for p in model.parameters() if p.requires_grad]
    codecs = make() if make else None
    losses = []
    for step in range(steps):
        grads, step_loss = [], 0.0
        for r in range(world):
            *inputs, labels = batch(r, step)
            model.zero_grad()
            loss = loss_fn(model(*inputs), labels)
            loss.backward()
            step_loss += loss.item() / world
            grads.append(_flat_grad(params))
        if codecs is None:
            total = np.sum(grads, axis=0, dtype=np.float32)
        else:
            total = simulate(codecs, grads)[0]
        flat = torch.from_numpy(np.ascontiguousarray(total)) / world
        with torch.no_grad():
            offset = 0
            for p in params:
                p.sub_(lr * flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        losses.append(step_loss)
    return losses


def _flat_grad(params: list[torch.nn.Parameter]) -> np.ndarray:
    """All parameters' gradients as one float32 vector (a copy)."""
    missing = [i for i, p in enumerate(params) if p.grad is None]
    if missing:
        raise RuntimeError(f"parameters {missing} got no gradient: is every one in the loss?")
    return torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]).numpy().copy()


def _codec_maker(world: int, name: str) -> Callable[[], list]:
    """The maker of run `name`'s codecs, for a run that has codecs (not the exact sum)."""
    make = _codecs(world)[name]
    if make is None:
        raise ValueError(f"run {name!r} is the exact sum: it has no codecs to time")
    return make


def switch_times(target: str, sizes: dict[str, int], world: int, reps: int) -> dict:
    """(model, method) -> seconds of one aggregation of the model's gradient, per rep:
    gloo all_reduce vs fixed point vs 16- and 8-bit lanes through `target`."""
    from bench.aggregation import GlooPool, SwitchGroup
    from testnet.fabric import Fabric

    rng = np.random.default_rng(0)
    makers = {
        "fixed point 32-bit": lambda: [FixedPoint(world) for _ in range(world)],
        "16-bit lanes + EF": _codec_maker(world, "16-bit lanes + EF"),
        "8-bit lanes + EF": _codec_maker(world, "8-bit lanes + EF"),
    }
    times: dict[tuple[str, str], list[float]] = {}
    gloo = GlooPool(sorted(set(sizes.values())))
    fabric = Fabric(target, world)
    try:
        for h in fabric.hosts:
            h.enable_ip_stack()
        group = SwitchGroup(fabric, world, 0.02 if target == "refswitch" else 0.2)
        for model, n in sizes.items():
            xs = [(rng.standard_normal(n) * 0.01).astype(np.float32) for _ in range(world)]
            codecs = {name: make() for name, make in makers.items()}
            for rep in range(reps + 1):  # the first is a warm-up
                secs = {"DDP over gloo": gloo.run(world, n)}
                for name, cs in codecs.items():
                    secs[name] = group.step(cs, xs)[0]
                if rep:
                    for name, t in secs.items():
                        times.setdefault((model, name), []).append(t)
        group.close()
    finally:
        fabric.close()
        gloo.close()
    return times


def plot(curves: dict[str, dict[str, list[float]]], path) -> None:
    """Training loss per step, one panel per model, smoothed over 10 steps."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 3.8), squeeze=False)
    for ax, (model, runs) in zip(axes[0], curves.items()):
        for name, losses in runs.items():
            smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
            ax.plot(np.arange(smooth.size) + 10, smooth, label=name, lw=1.2)
        ax.set(xlabel="step", ylabel="training loss (10-step mean)", yscale="log", title=model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Train every model with every codec; write bench/results/lowbit.md and lowbit.png."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps per run")
    p.add_argument("--world", type=int, default=4, help="workers")
    p.add_argument("--models", default="mlp,transformer", help="comma-separated: mlp, transformer")
    p.add_argument("--switch", choices=["bmv2", "refswitch"], help="also time the aggregation")
    p.add_argument("--reps", type=int, default=7, help="timed aggregations per method")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if any(m not in ("mlp", "transformer") for m in models) or args.steps <= LAST:
        p.error(f"--models takes mlp and/or transformer; --steps must exceed {LAST}")
    torch.set_num_threads(1)
    start = time.perf_counter()
    curves: dict[str, dict[str, list[float]]] = {}
    for model in models:
        curves[model] = {}
        for name, make in _codecs(args.world).items():
            t0 = time.perf_counter()
            curves[model][name] = train(model, make, args.world, args.steps)
            final = statistics.mean(curves[model][name][-LAST:])
            print(f"  {model} {name}: final loss {final:.4f} ({time.perf_counter() - t0:.0f} s)")
    lines = [
        f"# Convergence with low-bit lanes ({platform.machine()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m bench.lowbit --steps {args.steps} --world {args.world} --models "
        f"{','.join(models)}`; ran in {time.perf_counter() - start:.0f} s. Final loss = mean "
        f"training loss of the last {LAST} steps; same data, initialisation and steps for "
        "every run; EF = error feedback, gamma 0.9.",
        "",
        "| model | run | final loss | vs exact sum |",
        "|---|---|---:|---:|",
    ]
    parts = []
    for model, runs in curves.items():
        exact = statistics.mean(runs["exact sum (gloo)"][-LAST:])
        for name, losses in runs.items():
            final = statistics.mean(losses[-LAST:])
            lines.append(f"| {model} | {name} | {final:.4f} | {100 * (final / exact - 1):+.1f}% |")
        d16 = statistics.mean(runs["16-bit lanes + EF"][-LAST:]) / exact - 1
        d8 = statistics.mean(runs["8-bit lanes + EF"][-LAST:]) / exact - 1
        verdict = "MET" if abs(d16) <= 0.01 else "MISSED"
        parts.append(
            f"{model}: 16-bit {100 * d16:+.1f}% (target 1%: {verdict}), 8-bit {100 * d8:+.1f}%"
        )
    summary = f"low-bit lanes, loss vs exact sum after {args.steps} steps: " + "; ".join(parts)
    if args.switch:
        sizes = {m: sum(p.numel() for p in _task(m)[0].parameters()) for m in models}
        times = switch_times(args.switch, sizes, args.world, args.reps)
        lines += [
            "",
            f"One step's aggregation of the model's gradient through {args.switch}, "
            f"W = {args.world} (median [min, max] of {args.reps}, methods alternating):",
            "",
            "| model | gradient elements | method | ms per step | gloo / method |",
            "|---|---:|---|---:|---:|",
        ]
        for model in models:
            gloo = statistics.median(times[(model, "DDP over gloo")])
            for (m, name), t in times.items():
                if m == model:
                    med = statistics.median(t)
                    lines.append(
                        f"| {model} | {sizes[model]:,} | {name} | {med * 1e3:.1f} "
                        f"[{min(t) * 1e3:.1f}, {max(t) * 1e3:.1f}] | {gloo / med:.2f}x |"
                    )
            speed = gloo / statistics.median(times[(model, "8-bit lanes + EF")])
            summary += f"; {model} 8-bit aggregation {speed:.2f}x gloo on {args.switch}"
    lines += ["", f"Summary: {summary}.", "", "![training loss](lowbit.png)", ""]
    plot(curves, plot_path("lowbit.png"))
    publish("lowbit", lines, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
