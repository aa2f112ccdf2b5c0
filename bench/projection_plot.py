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
    speedup: Callable[[int, float, float], float],
    workers: Sequence[int],
    links: Sequence[float],
    densities: Sequence[float],
    title: str,
    path: Path,
) -> None:
    """speedup(W, link Gbit/s, density) over W, per link rate, a panel per density."""
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(densities), figsize=(4.6 * len(densities), 4.2), squeeze=False, sharey=True
    )
    for ax, d in zip(axes[0], densities):
        for link in links:
            ax.plot(
                workers,
                [speedup(w, link, d) for w in workers],
                "o-",
                ms=3,
                label=f"{link:g} Gbit/s",
            )
        ax.axhline(1.0, color="k", lw=0.8)
        for p in PUBLISHED:
            ax.axhline(p.ratio, color=p.style[0], ls=p.style[1:], lw=1.0, label=p.label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers W")
        ax.set_title(f"density {d:g}" + (" (dense)" if d == 1 else ""))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("best peer all-reduce time / switch time (> 1: switch wins)")
    axes[0][-1].legend(fontsize=6, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
