"""Retransmission timeout, fixed versus measured: retransmissions per chunk and time per
round of the transport, at 1 and 4 workers, without and with 1% loss, on each switch target.

"fixed" is the former timer (20 ms, doubling per try, every chunk's timer from its own
send); "timeouts" derives the first try's timeout from round trips (RFC 6298 SRTT + 4
RTTVAR, 5 ms .. 0.5 s, backed off per expiry; homagg/worker/transport/retransmission_timer.py) and
restarts
the timers as RFC 6298's one timer (homagg/worker/transport/switch_transport.py), and resends a
lost chunk only
when its timer expires; "measured" (the transport's default) also resends a chunk that
three later chunks' answers overtook at once (fast retransmit). Each round is one all-reduce of
--cells int32 cells (--bmv2-cells on BMv2) by W workers, threads of this process with one
namespace and socket each; loss is injected per datagram in both directions
(homagg/worker/transport/channel.py FaultyChannel). Rounds of the two timers alternate, so both see
the same
machine load; the table gives the median [min, max] over rounds, and the measured timer's
first-try timeout (RTO): median and largest over its samples, and how many samples found
it at the maximum. Writes bench/results/retransmission.md.

    python -m bench.retransmission [--rounds 5] [--cells 1048576] [--bmv2-cells 1048576]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from bench.publish import publish

WORLD_SIZES = (1, 4)
LOSSES = (0.0, 0.01)
TIMERS = ("fixed", "timeouts", "measured")
MEASURED = ("timeouts", "measured")  # the timers whose RTO is measured (and reported)
POOL_SIZE = 32
JOIN_TIMEOUT = 300.0


class Group:
    """One job of w workers on the fabric's hosts from `offset` on, one transport each."""

    def __init__(self, fabric, offset: int, w: int, loss: float, timer: str, seed: int) -> None:
        from homagg.lab.aggjob import Job
        from homagg.worker.transport.channel import Channel, FaultyChannel
        from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

        self.job = Job(fabric, fabric.hosts[offset : offset + w], pool_size=POOL_SIZE)
        self.transports = []
        for r in range(w):
            channel: Channel = self.job.channel(r)
            if loss:
                channel = FaultyChannel(channel, loss=loss, seed=seed + r)
            cfg = TransportConfig(
                job_id=self.job.job_id,
                rank=r,
                world_size=w,
                pool_size=POOL_SIZE,
                adaptive_timeout=timer in MEASURED,
                fast_resend_after=3 if timer == "measured" else 0,
            )
            self.transports.append(SwitchTransport(cfg, channel))
        self.rtos: list[float] = []  # the first-try timeout after each sample, every worker
        for t in self.transports:
            t.timer.sample = self._recording(t.timer)  # type: ignore[method-assign]

    def _recording(self, timer):
        """timer.sample that also records the timeout it leaves."""
        sample = timer.sample

        def record(rtt: float) -> None:
            sample(rtt)
            self.rtos.append(timer.rto)

        return record

    def round(self, cells: np.ndarray) -> tuple[float, int, int]:
        """One all-reduce on every worker: (wall seconds, retransmissions, chunks)."""
        from homagg.lab.threads import run_threads
        from homagg.wire.constants import Op

        before = [(t.stats.retransmissions, t.stats.chunks) for t in self.transports]
        elapsed, _ = run_threads(
            [partial(t.allreduce, Op.ADD, cells) for t in self.transports], JOIN_TIMEOUT
        )
        retx = sum(t.stats.retransmissions - b[0] for t, b in zip(self.transports, before))
        chunks = sum(t.stats.chunks - b[1] for t, b in zip(self.transports, before))
        return elapsed, retx, chunks

    def rto_stats(self) -> dict[str, float]:
        """The first-try timeout over every sample of the measured rounds: median and largest
        (ms), and the share of samples that left it at the maximum."""
        rtos = np.asarray(self.rtos)
        cap = self.transports[0].timer.maximum
        return {
            "rto_median_ms": 1e3 * float(np.median(rtos)) if rtos.size else float("nan"),
            "rto_max_ms": 1e3 * float(rtos.max()) if rtos.size else float("nan"),
            "at_cap": float(np.mean(rtos >= cap)) if rtos.size else float("nan"),
        }

    def close(self) -> None:
        for t in self.transports:
            t.channel.close()


def measure(
    target: str, n: int, rounds: int, world_sizes: tuple[int, ...] = WORLD_SIZES, losses=LOSSES
) -> dict[tuple, dict[str, float]]:
    """Per (W, loss, timer): median round ms, retransmissions per chunk, final RTO ms."""
    from homagg.lab.fabric import Fabric

    cells = np.ones(n, np.int32)
    rows: dict[tuple, dict[str, float]] = {}
    hosts = max(world_sizes)  # per timer: every timer's job runs side by side
    with Fabric(
        target, hosts * len(TIMERS), Path(tempfile.mkdtemp(prefix="bench-retx-"))
    ) as fabric:
        for h in fabric.hosts:
            h.enable_ip_stack()
        for w in world_sizes:
            for loss in losses:
                groups = {
                    tm: Group(fabric, i * hosts, w, loss, tm, seed=17)
                    for i, tm in enumerate(TIMERS)
                }
                samples: dict[str, list] = {tm: [] for tm in TIMERS}
                try:
                    for tm in TIMERS:
                        groups[tm].round(cells)  # warm-up: the first round trips
                        groups[tm].rtos.clear()
                    for _ in range(rounds):
                        for tm in TIMERS:
                            samples[tm].append(groups[tm].round(cells))
                    for tm in TIMERS:
                        times = [s[0] for s in samples[tm]]
                        retx = sum(s[1] for s in samples[tm])
                        chunks = sum(s[2] for s in samples[tm])
                        rows[(w, loss, tm)] = {
                            "ms": 1e3 * statistics.median(times),
                            "ms_min": 1e3 * min(times),
                            "ms_max": 1e3 * max(times),
                            "retx_per_chunk": retx / chunks,
                            **groups[tm].rto_stats(),
                        }
                        print(target, w, loss, tm, rows[(w, loss, tm)], flush=True)
                finally:
                    for g in groups.values():
                        g.close()
    return rows


def report(results: dict[str, dict], sizes: dict[str, int], rounds: int) -> list[str]:
    """The markdown table: the timers side by side per target, W and loss."""
    lines = [
        "# Retransmission timeout: fixed 20 ms versus measured round trips (RFC 6298)",
        "",
        f"`python -m bench.retransmission --rounds {rounds}` on {platform.machine()}"
        f" ({os.cpu_count()} cores, shared), {time.strftime('%Y-%m-%d')}. Pool size "
        f"{POOL_SIZE}; one round is an all-reduce of n int32 cells per worker ("
        + ", ".join(f"{t}: n = {n:,}" for t, n in sizes.items())
        + f"); {rounds} rounds per timer, the timers alternating; fixed: 20 ms; timeouts: "
        "the measured timeout, a lost chunk resent when its timer expires; measured (the "
        "default): the same, and a chunk three later answers overtook resent at once. "
        "ms per round: median [min, max]; retransmissions per chunk over all rounds and "
        "workers; RTO: the measured timer's first-try timeout after each of its samples, "
        "median and largest, and the share of samples that left it at the maximum (500 ms).",
        "",
        "| target | W | loss | retx/chunk "
        + " / ".join(TIMERS)
        + " | ms/round "
        + " / ".join(TIMERS)
        + " | RTO measured, median / max (ms) | at max |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for target, rows in results.items():
        for w, loss in sorted({(w, loss) for w, loss, _ in rows}):
            r = [rows[(w, loss, tm)] for tm in TIMERS]
            m = rows[(w, loss, "measured")]
            lines.append(
                f"| {target} | {w} | {loss:.0%} | "
                + " / ".join(f"{x['retx_per_chunk']:.3f}" for x in r)
                + " | "
                + " / ".join(_ms(x) for x in r)
                + f" | {m['rto_median_ms']:.1f} / {m['rto_max_ms']:.0f} | {m['at_cap']:.2%} |"
            )
    return lines


def _ms(row: dict[str, float]) -> str:
    """Median [min, max] ms per round."""
    return f"{row['ms']:.0f} [{row['ms_min']:.0f}, {row['ms_max']:.0f}]"


def main(argv: list[str] | None = None) -> int:
    """Measure on every available target and write bench/results/retransmission.md."""
    p = argparse.ArgumentParser(
        prog="python -m bench.retransmission",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds per timer (default 5)")
    p.add_argument("--cells", type=int, default=1 << 20, help="cells per round, refswitch")
    p.add_argument("--bmv2-cells", type=int, default=1 << 20, help="cells per round, BMv2")
    p.add_argument(
        "--targets", nargs="+", default=None, help="default: refswitch, and bmv2 when installed"
    )
    p.add_argument(
        "--world-sizes", type=int, nargs="+", default=list(WORLD_SIZES), help="default: 1 4"
    )
    p.add_argument("--losses", type=float, nargs="+", default=list(LOSSES), help="default: 0 0.01")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.cells < 1 or args.bmv2_cells < 1:
        p.error("--rounds, --cells and --bmv2-cells must be positive")
    from homagg.lab.namespace import have_privileges
    from homagg.lab.switch_process import compared_targets

    if not have_privileges():
        p.error("needs root and iproute2 (network namespaces)")
    targets = args.targets or compared_targets()
    sizes = {t: args.bmv2_cells if t == "bmv2" else args.cells for t in targets}
    if any(w < 1 for w in args.world_sizes) or any(not 0 <= x < 1 for x in args.losses):
        p.error("--world-sizes must be positive and --losses in [0, 1)")
    world_sizes, losses = tuple(args.world_sizes), tuple(args.losses)
    results = {t: measure(t, sizes[t], args.rounds, world_sizes, losses) for t in targets}
    w, loss = max(world_sizes), max(losses)
    publish(
        "retransmission",
        report(results, sizes, args.rounds),
        summary=", ".join(
            f"{t} W={w} {loss:.0%} loss: retx/chunk "
            + " ".join(f"{tm} {r[(w, loss, tm)]['retx_per_chunk']:.3f}" for tm in TIMERS)
            + ", ms/round "
            + " ".join(f"{tm} {r[(w, loss, tm)]['ms']:.0f}" for tm in TIMERS)
            for t, r in results.items()
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
