"""Sparse embedding gradients, measured: the NCF of `make run` (run/model.py: 20,000 x 16
user and 4,000 x 16 item embeddings, batch 64) with `nn.Embedding(sparse=True)` against
`sparse=False`, its gradients summed by the switch (homagg.attach, lossless) and by DDP
over gloo: the iteration time and the bytes each rank sends per step.

Two ranks in network namespaces of the test fabric, their gloo traffic and their
aggregation both through the reference switch, a controller in this process. Every rank
runs the four configurations in turn in one process, one process group and one switch job
each, the order reversed every round, so all four see the same machine; the table gives
the median over every round's steps after a warm-up. Writes
bench/results/sparse_embeddings.md.

    python -m bench.sparse_embeddings [--rounds 3] [--steps 20] [--warmup 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.publish import publish
from homagg.lab import REPO_ROOT

CONFIGS = (  # (aggregation, embedding gradients)
    ("switch", "sparse"),
    ("switch", "dense"),
    ("gloo", "sparse"),
    ("gloo", "dense"),
)
MASTER_PORT = 29671
# Each configuration's destroyed process group, kept until exit: freeing a gloo group runs
# its destructor with the GIL held while it joins its worker threads, and a thread still
# dropping a finished collective's Python tensor waits for the GIL (a deadlock, seen here).
_GROUPS: list[Any] = []


def _timed(hook_seconds: list[float]) -> Any:
    """The switch hook, its time added to hook_seconds[0] (no annotations: DDP checks them)."""
    from homagg.worker.ddp.hook import switch_allreduce_hook

    def timed(state, bucket):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return switch_allreduce_hook(state, bucket)
        finally:
            hook_seconds[0] += time.perf_counter() - start

    return timed


def _counters(state: Any, hook_seconds: list[float]) -> list[float]:
    """Running totals of this rank's switch path (zeros for gloo): bytes and passes, then
    seconds in the hook, in the switch exchanges, in the codec (encode and decode), in the
    agreements, and the packets sent."""
    if state is None or state.agent is None or state.agent.transport is None:
        return [0.0] * 8
    t = state.agent.transport.stats
    s = state.stats
    return [
        float(s.wire_bytes),
        float(s.switch_buckets),
        hook_seconds[0],
        t.exchange_seconds,
        t.encode_seconds + t.decode_seconds,
        s.agreement_seconds,
        float(t.packets_sent),
        float(s.fallback_buckets),
    ]


SPLIT = ("hook", "exchange", "codec", "agreement")  # seconds per step, the mean of the ranks


def run_config(path: str, grads: str, steps: int, warmup: int, iface: str) -> list[dict]:
    """One configuration on this rank: its own process group (and job); per-step records
    (agreed: the slowest rank's time, the mean of the ranks' bytes and time split)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from homagg.worker.ddp.attach import attach
    from run.model import DEFAULT_LR, JobShape, make_task

    shape = JobShape()
    group = dist.new_group(backend="gloo")
    task = make_task("ncf", shape)
    for name in ("user", "item"):  # before DDP: it reads which gradients are sparse
        getattr(task.model, name).sparse = grads == "sparse"
    model = DDP(task.model, process_group=group)
    state, hook_seconds = None, [0.0]
    if path == "switch":  # as make run: one support key per embedding row when sparse
        opts = {"support_block": shape.dim} if grads == "sparse" else {}
        state = attach(None, "lossless", codec_options=opts, group=group, name="bench")
        model.register_comm_hook(state, _timed(hook_seconds))
    opt = torch.optim.SGD(model.parameters(), lr=DEFAULT_LR["ncf"])
    rank = dist.get_rank()
    sent = Path(f"/sys/class/net/{iface}/statistics/tx_bytes")
    records = []
    for step in range(warmup + steps):
        before = _counters(state, hook_seconds)
        tx, start = int(sent.read_text()), time.perf_counter()
        *inputs, labels = task.batch(rank, step)
        opt.zero_grad()
        task.loss(model(*inputs), labels).backward()
        opt.step()
        seconds = time.perf_counter() - start
        after = _counters(state, hook_seconds)
        delta = [a - b for a, b in zip(after, before)]
        t = torch.tensor([seconds, float(int(sent.read_text()) - tx), *delta], dtype=torch.float64)
        top = t.clone()
        dist.all_reduce(t, group=group)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        if step >= warmup:
            world = dist.get_world_size(group)
            mean = (t / world).tolist()
            records.append(
                {
                    "seconds": float(top[0]),
                    "mean_seconds": mean[0],
                    "tx_bytes": mean[1],
                    "agg_bytes": mean[2],
                    "switch_buckets": int(top[3]),
                    **{k: mean[4 + i] for i, k in enumerate(SPLIT)},
                    "packets": mean[8],
                    "fallback_buckets": int(top[9]),
                }
            )
    dist.barrier(group=group)
    dist.destroy_process_group(group)  # the switch job ends here
    _GROUPS.append(group)
    return records


def rank_main(a: argparse.Namespace) -> None:
    """One rank: every configuration, alternating, for --rounds rounds."""
    import faulthandler

    import torch.distributed as dist

    from homagg.environment import IFACE_ENV

    faulthandler.dump_traceback_later(a.timeout - 30, exit=True)  # a stuck rank says where
    os.environ.update(
        {
            "RANK": str(a.rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": a.master,
            "MASTER_PORT": str(MASTER_PORT),
            "GLOO_SOCKET_IFNAME": a.iface,
            IFACE_ENV: a.iface,
        }
    )
    from datetime import timedelta

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    results: dict[str, list[dict]] = {f"{p}, {g}": [] for p, g in CONFIGS}
    for rnd in range(a.rounds):
        for p, g in CONFIGS if rnd % 2 == 0 else CONFIGS[::-1]:
            results[f"{p}, {g}"] += run_config(p, g, a.steps, a.warmup, a.iface)
    if a.rank == 0:
        Path(a.out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _controller(fabric: Any, tmp: Path) -> tuple[Any, str]:
    """A controller in this process over the fabric's switch, on a Unix socket."""
    from homagg.control.config import parse_config
    from homagg.control.service import ControllerServer
    from homagg.lab.addresses import host_entry
    from homagg.lab.fabric import SERVICE_IP, SWITCH_MAC

    listen = f"unix:{tmp}/ctl.sock"
    doc = {
        "controller": {"listen": "127.0.0.1:0", "database": str(tmp / "controller.db")},
        "switch": [
            {
                "name": "s1",
                "address": fabric.switch.address,
                "mac": SWITCH_MAC,
                "service_ip": SERVICE_IP,
                "hosts": [host_entry(i) for i in range(len(fabric.hosts))],
            }
        ],
    }
    server = ControllerServer(dataclasses.replace(parse_config(doc, tmp), listen=listen))
    server.start()
    return server, listen


def measure(a: argparse.Namespace) -> dict[str, list[dict]]:
    """Both ranks in the fabric's namespaces; rank 0's records per configuration."""
    from homagg.api.client import ControllerClient
    from homagg.environment import CONTROLLER_ENV, INSECURE_ENV
    from homagg.lab.fabric import Fabric
    from homagg.lab.poll import wait_for
    from homagg.lab.processes import run_together

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # tear the fabric down
    tmp = Path(tempfile.mkdtemp(prefix="bench-sparse-"))
    fabric = Fabric("refswitch", 2, tmp)
    server = None
    try:
        for h in fabric.hosts:
            h.enable_ip_stack()
        fabric.release_connection()  # the controller becomes the primary
        server, address = _controller(fabric, tmp)
        with ControllerClient(address, 5.0, insecure=True) as client:
            wait_for(lambda: all(s.connected for s in client.status().switches), 30, "sync")
        out = tmp / "results.json"
        cmds = []
        for r, h in enumerate(fabric.hosts):
            cmd = ["ip", "netns", "exec", h.namespace, sys.executable, "-m", __spec__.name]
            cmd += ["--rank", str(r), "--master", fabric.hosts[0].ip, "--iface", h.iface]
            cmd += ["--rounds", str(a.rounds), "--steps", str(a.steps), "--timeout", str(a.timeout)]
            cmds.append([*cmd, "--warmup", str(a.warmup), "--out", str(out)])
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
        env[CONTROLLER_ENV] = address
        env[INSECURE_ENV] = "1"  # the controller of this bench serves plaintext
        done = run_together(cmds, a.timeout, env=env, cwd=REPO_ROOT)
        if any(code for code, _ in done):
            raise SystemExit("\n".join(text[-3000:] for _, text in done))
        return json.loads(out.read_text())
    finally:
        if server is not None:
            server.stop(0)
        fabric.close()
        shutil.rmtree(tmp, ignore_errors=True)


def table(results: dict[str, list[dict]]) -> list[str]:
    """The markdown table: median ms/step, kB sent per rank per step, ratios."""
    med = {
        name: {k: statistics.median(r[k] for r in recs) for k in ("seconds", "tx_bytes")}
        | {k: statistics.median(r[k] for r in recs) for k in ("agg_bytes", "switch_buckets")}
        | {"fallbacks": sum(r["fallback_buckets"] for r in recs), "steps": len(recs)}
        for name, recs in results.items()
    }
    lines = [
        "| aggregation | embedding gradients | ms / step | wire kB / rank / step | "
        "of which aggregation frames | switch passes / step | vs gloo, sparse (time, bytes) "
        "| fallback buckets |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = med["gloo, sparse"]
    for p, g in CONFIGS:
        m = med[f"{p}, {g}"]
        agg = f"{m['agg_bytes'] / 1e3:.1f}" if p == "switch" else "-"
        passes = f"{m['switch_buckets']:g}" if p == "switch" else "-"
        lines.append(
            f"| {'switch, lossless' if p == 'switch' else 'DDP over gloo'} | {g} "
            f"| {m['seconds'] * 1e3:.1f} | {m['tx_bytes'] / 1e3:.1f} | {agg} | {passes} "
            f"| {m['seconds'] / base['seconds']:.2f}x, {m['tx_bytes'] / base['tx_bytes']:.2f}x "
            f"| {m['fallbacks']} |"
        )
    return lines


def split_table(results: dict[str, list[dict]]) -> list[str]:
    """Where a switch step's time goes (the mean of the ranks, median over steps): in the
    hook (waiting on the switch exchanges, the codec's encode and decode, the agreements,
    the rest: COO and bucket conversions, the hook's bookkeeping) and outside it (forward,
    backward, optimizer, DDP)."""
    lines = [
        "| embedding gradients | ms / step | outside the hook | hook | switch exchanges "
        "| codec | agreements | rest of the hook | packets / rank / step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in ("sparse", "dense"):
        recs = results[f"switch, {g}"]

        def med(f: Any, recs: list[dict] = recs) -> float:
            return statistics.median(f(r) for r in recs) * 1e3

        rest = med(lambda r: r["hook"] - r["exchange"] - r["codec"] - r["agreement"])
        cells = [
            med(lambda r: r["mean_seconds"]),
            med(lambda r: r["mean_seconds"] - r["hook"]),
            *(med(lambda r, k=k: r[k]) for k in SPLIT),
            rest,
        ]
        packets = statistics.median(r["packets"] for r in recs)
        lines.append(f"| {g} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {packets:g} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Command line: the benchmark (as root), or one of its ranks (--rank)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="measured steps per round and config")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--master", default="", help=argparse.SUPPRESS)
    p.add_argument("--iface", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank is not None:
        rank_main(a)
        return
    start = time.monotonic()
    results = measure(a)
    minutes = (time.monotonic() - start) / 60
    head = [
        "# Sparse embedding gradients: the switch and gloo",
        "",
        f"NCF of `make run` (20,000 x 16 and 4,000 x 16 embeddings, batch 64), W = 2, "
        f"reference switch, namespaces; {platform.machine()}, {os.cpu_count()} cores, "
        f"{minutes:.1f} min; median of {a.rounds} rounds x {a.steps} steps per configuration, "
        "the configurations alternating. Wire: bytes each rank's interface sent per step "
        "(aggregation frames, gloo, the hook's agreements).",
        "",
    ]
    sw = statistics.median(r["seconds"] for r in results["switch, sparse"])
    sd = statistics.median(r["seconds"] for r in results["switch, dense"])
    where = [
        "",
        "Where a step of the switch runs goes, in ms (the mean of the ranks, median over "
        "steps; the hook blocks, so its time adds to the step's):",
        "",
    ]
    publish(
        "sparse_embeddings",
        head + table(results) + where + split_table(results),
        f"sparse embeddings: switch {sd / sw:.2f}x faster than dense embeddings through it",
    )


if __name__ == "__main__":
    main()
