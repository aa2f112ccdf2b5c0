"""The transport's congestion window on and off side by side (`python -m bench.shaped_links
--window-off`): per W, link rate and size, the switch's step with the window and with the
pool alone, from the same run, alternating: seconds, the ratio, the speed-up over gloo, the
goodput's share of the link, the qdisc (htb) drops, retransmissions, timeouts, the window's
halvings and its size after the step, and the steps that stalled (a rank's transport gave
up: no sum)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

ON, OFF = "switch", "switch_nowin"  # bench.shaped_links's methods (SWITCH, SWITCH_NO_WINDOW)


def _secs(runs: list[dict[str, float]]) -> str:
    """Median [min, max] seconds of the steps that completed, and how many stalled."""
    done = [r["secs"] for r in runs if not r.get("failed")]
    stalled = len(runs) - len(done)
    if not done:
        return f"stalled {stalled}/{len(runs)}"
    cell = f"{statistics.median(done):.2f} [{min(done):.2f}, {max(done):.2f}]"
    return cell + (f", stalled {stalled}/{len(runs)}" if stalled else "")


def _median(runs: list[dict[str, float]], key: str) -> float:
    """The median of `key` over the steps that completed (nan when none did)."""
    done = [r[key] for r in runs if not r.get("failed")]
    return statistics.median(done) if done else float("nan")


def _total(runs: list[dict[str, float]], key: str) -> int:
    return int(sum(r.get(key, 0) for r in runs))


def window_row(record: dict, w: int, mbit: float, n: int) -> str:
    """One point's row: window on / off."""
    gloo = _median(record[(w, mbit, n, "gloo")], "secs")
    on, off = record[(w, mbit, n, ON)], record[(w, mbit, n, OFF)]
    s_on, s_off = _median(on, "secs"), _median(off, "secs")
    goodput = [n * 32 / s / 1e6 for s in (s_on, s_off)]
    share = " / ".join(f"{g / mbit:.0%}" for g in goodput) if mbit else "-"
    link = f"{mbit:g} Mbit/s" if mbit else "unshaped"
    return (
        f"| {w} | {link} | {n:,} | {_secs(on)} | {_secs(off)} | {s_off / s_on:.2f}x | "
        f"{gloo / s_on:.2f}x / {gloo / s_off:.2f}x | {goodput[0]:.1f} / {goodput[1]:.1f} | "
        f"{share} | {_total(on, 'drops')} / {_total(off, 'drops')} | "
        f"{_total(on, 'retx')} / {_total(off, 'retx')} | "
        f"{_total(on, 'timeouts')} / {_total(off, 'timeouts')} | {_total(on, 'halvings')} | "
        f"{_median(on, 'cwnd'):g} |"
    )


def window_table(
    record: dict, worlds: Iterable[int], rates: Sequence[float], sizes: Iterable[int]
) -> list[str]:
    """The markdown of the window comparison (every point that has both methods)."""
    lines = [
        "Congestion window on / off (the same ranks, steps alternating with gloo's): seconds "
        "median [min, max] of the steps that completed and the steps that stalled (a rank's "
        "transport gave up: 12 retransmissions unanswered); off / on > 1: the window is "
        "faster; gloo / switch; goodput Mbit/s per worker and its share of the link; qdisc "
        "drops (htb's queues at both ends of every host link), retransmissions and timeouts "
        "(retransmissions on a timer's expiry) of all ranks over all repetitions; the "
        "window's halvings (all ranks) and its median size after the step (chunks).",
        "",
        "| W | link | n | window on s | off s | off / on | gloo / switch on / off | "
        "goodput on / off | share on / off | qdisc drops on / off | retx on / off | "
        "timeouts on / off | halvings | window |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in worlds:
        for mbit in rates:
            for n in sizes:
                if (w, mbit, n, OFF) in record and (w, mbit, n, ON) in record:
                    lines.append(window_row(record, w, mbit, n))
    return [*lines, ""]
