"""The projection's plot: by how much the switch's step beats the best peer all-reduce
(ring or halving-doubling) against W, one curve per link rate, one panel per density,
with the published ratios of SwitchML and of the lossless-compression paper drawn on it
(the "up to" figures their abstracts state; docs/performance.md cites them). They were
measured on the papers' own testbeds, so they are lines across, not points at a W."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.publish import pyplot


@dataclass(frozen=True)
class Published:
    """A published 'up to' ratio, with what it measured and where it is stated."""

    ratio: float
    label: str
    style: str


PUBLISHED = (
    Published(5.5, "SwitchML (Sapio et al., NSDI 2021): up to 5.5x training speedup", "m:"),
    Published(6.33, "lossless compression (Li et al., ICML 2024): up to 6.33x aggregation", "c--"),
    Published(3.74, "lossless compression (Li et al., ICML 2024): up to 3.74x per iteration", "c:"),
)


def plot(
    rows: Sequence[tuple[str, Callable[[int, float, float], float]]],
    workers: Sequence[int],
    links: Sequence[float],
    densities: Sequence[float],
    path: Path,
) -> None:
    """One row of panels per (title, speedup(W, link Gbit/s, density)), a panel per
    density, speedup over W with a curve per link rate."""
    plt = pyplot()
    fig, axes = plt.subplots(
        len(rows),
        len(densities),
        figsize=(4.2 * len(densities), 3.4 * len(rows) + 1.0),
        squeeze=False,
        sharey=True,
    )
    for i, (title, speedup) in enumerate(rows):
        for ax, d in zip(axes[i], densities):
            for link in links:
                ys = [speedup(w, link, d) for w in workers]
                ax.plot(workers, ys, "o-", ms=3, label=f"{link:g} Gbit/s links")
            ax.axhline(1.0, color="k", lw=0.8)
            for p in PUBLISHED:
                ax.axhline(p.ratio, color=p.style[0], ls=p.style[1:], lw=1.0, label=p.label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"density {d:g}" + (" (dense)" if d == 1 else ""), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        axes[i][0].set_ylabel(f"{title}\n\nbest peer all-reduce / switch\n(> 1: the switch wins)")
    for ax in axes[-1]:
        ax.set_xlabel("workers W")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
