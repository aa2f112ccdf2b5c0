"""One rank of `make run`'s job, started by torchrun inside its Mininet host: trains the NCF
model (or the small dense MLP, --model mlp) with DDP, its gradients summed by the switch
(--mode switch, the homagg DDP hook) or by gloo (--mode gloo), and reports each step
(rank 0) as a JSON line and a progress line.
The switch run's --overlap: blocking (the hook waits), async (the hook's communication
thread), dear (DeAR: no DDP, updates in the next forward); --codec auto picks per bucket.

Example (inside host hg1h1 of run 1, 2 hosts, under torchrun):
  torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 10.0.1.1 \\
    -m run.train --mode switch --controller 10.0.1.100:50051 --iface hg1h1-eth0 --out out

Rank 0 creates the job; each rank finds its address and the controller its switch port
(worker/attach.py).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.

import argparse
import json
import math
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from run import peers
from run.model import DEFAULT_LR, MODELS, JobShape, make_task
from worker.attach import connect
from worker.ddp_hook import AUTO, SwitchHookState, switch_allreduce_hook
from worker.dear import DearDataParallel


@dataclass
class Tracked:
    """The hook state plus the largest |local gradient| a bucket held this step (its
    exponent bounds every block exponent the codec agrees on: docs/codecs.md)."""

    inner: SwitchHookState
    local_max: float = 0.0


def _grad_max(grad: torch.Tensor) -> float:
    """Largest |element| of a gradient, dense or sparse (sparse embeddings: its values)."""
    values = grad.coalesce().values() if grad.is_sparse else grad
    return float(values.abs().max()) if values.numel() else 0.0


def tracked_hook(state: Tracked, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """switch_allreduce_hook, recording the bucket's max |gradient| first."""
    buf = bucket.buffer()
    vals = buf.coalesce().values() if buf.is_sparse else buf
    if vals.numel():
        state.local_max = max(state.local_max, float(vals.abs().max()))
    return switch_allreduce_hook(state.inner, bucket)


def tx_bytes(iface: str) -> int:
    """Bytes this host sent on its interface (everything: aggregation, gloo, control)."""
    return int(Path(f"/sys/class/net/{iface}/statistics/tx_bytes").read_text())


def train(a: argparse.Namespace) -> None:
    """Run the job on this rank; rank 0 writes <out>/<mode>.jsonl and <out>/<mode>.pt."""
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = JobShape(users=a.users, items=a.items, dim=a.dim, batch=a.batch)
    task = make_task(a.model, shape)
    peers.prepare(a.mode, task.model)  # before DDP: it reads which gradients are sparse
    dear = a.mode == "switch" and a.overlap == "dear"
    model = task.model if dear else DDP(task.model)
    tracked: Tracked | None = None
    agent = None
    lr = a.lr if a.lr is not None else DEFAULT_LR[a.model]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if a.mode == "switch":
        # What homagg.attach does, with the hook wrapped to record local gradient maxima.
        agent, reason = connect(
            a.codec, controller=a.controller, pool_size=a.pool_size, name="make-run"
        )
        # One support key per embedding row: the index phase shrinks dim-fold.
        opts: dict[str, Any] = {"support_block": a.dim} if task.sparse else {}
        if a.codec == AUTO:  # per codec name; the sparse rows' key for lossless only
            opts = {"lossless": opts}
        elif a.codec != "lossless":
            opts = {}
        if a.codec != AUTO:
            opts.update(codec_options(a.codec_option))
        hook_state = SwitchHookState(
            agent,
            codec=a.codec,
            unavailable_reason=reason,
            codec_options=opts,
            asynchronous=a.overlap != "blocking",
        )
        tracked = Tracked(hook_state)
        if dear:
            model = DearDataParallel(task.model, opt, hook_state, tune_steps=2)
        else:
            assert isinstance(model, DDP)
            model.register_comm_hook(tracked, tracked_hook)
    out = Path(a.out)
    # closed in the finally below (rank 0 only writes the step records)
    log = open(out / f"{a.mode}.jsonl", "w") if rank == 0 else None  # noqa: SIM115
    dense = sum(p.numel() for p in model.parameters()) * 4
    if a.mode not in ("switch", "gloo"):
        assert isinstance(model, DDP)  # the peer methods are DDP comm hooks
        peers.attach(a.mode, model, a.steps)  # DDP keeps the hook's state
    try:
        for step in range(a.steps):
            start, sent = time.perf_counter(), tx_bytes(a.iface)
            before = _stats(tracked)
            *inputs, labels = task.batch(rank, step)
            opt.zero_grad()
            loss = task.loss(model(*inputs), labels)
            loss.backward()
            if isinstance(model, DearDataParallel):  # DeAR steps in the next forward
                assert tracked is not None
                tracked.local_max = max(
                    [_grad_max(p.grad) for p in model.parameters() if p.grad is not None] + [0.0]
                )
                if step == a.steps - 1:
                    model.flush()
            else:
                opt.step()
            seconds = time.perf_counter() - start
            wire = tx_bytes(a.iface) - sent
            after = _stats(tracked)
            local_max = tracked.local_max if tracked else 0.0
            # One tiny all_reduce for the report (not part of the timed step).
            t = torch.tensor(
                [
                    loss.item(),
                    seconds,
                    float(wire),
                    local_max,
                    float(after[0] - before[0]),
                    float(after[1] - before[1]),
                    float(after[2] - before[2]),
                    float(after[3] - before[3]),
                    *(x - y for x, y in zip(after[4:], before[4:])),
                ],
                dtype=torch.float64,
            )
            dist.all_reduce(t)
            if tracked:
                tracked.local_max = 0.0
                m = torch.tensor([local_max], dtype=torch.float64)
                dist.all_reduce(m, op=dist.ReduceOp.MAX)
                local_max = float(m)
            if log is not None:
                pmax = max(float(p.detach().abs().max()) for p in model.parameters())
                rec = {
                    "step": step,
                    "loss": float(t[0]) / world,
                    "seconds": float(t[1]) / world,
                    "tx_bytes": float(t[2]) / world,
                    "dense_bytes": dense,
                    "agg_wire": float(t[4]) / world,
                    "agg_dense": float(t[5]) / world,
                    "retransmissions": int(t[6]),
                    "fallback_buckets": int(t[7]),
                    "switch_seconds": float(t[8]) / world,
                    "agreement_seconds": float(t[9]) / world,
                    # the switch_seconds split (worker/transport.py): codec, exchanges
                    "encode_seconds": float(t[10]) / world,
                    "wait_seconds": float(t[11]) / world,
                    "decode_seconds": float(t[12]) / world,
                    "grad_max": local_max,
                    "param_max": pmax,
                    **_overlap_report(model, tracked),
                }
                log.write(json.dumps(rec) + "\n")
                log.flush()
                print(_progress(a.mode, a.steps, rec), flush=True)
        if rank == 0:
            torch.save(
                {k: v.detach().clone() for k, v in task.model.state_dict().items()},
                out / f"{a.mode}.pt",
            )
    finally:
        if log is not None:
            log.close()
        if isinstance(model, DearDataParallel):
            model.close()
        elif tracked is not None:
            tracked.inner.close()
        if agent is not None:
            agent.close()


def _overlap_report(model: Any, tracked: Tracked | None) -> dict[str, Any]:
    """Rank 0's view of the overlap modes: codec="auto"'s choices so far (every rank makes
    the same ones), DeAR's bucket size and its tuning measurements."""
    rec: dict[str, Any] = {}
    if tracked is not None and tracked.inner.controller is not None:
        rec["auto_choices"] = dict(tracked.inner.stats.auto_choices)
        rec["host_buckets"] = tracked.inner.stats.host_buckets
    if isinstance(model, DearDataParallel):
        rec["dear_bucket_bytes"] = model.bucket_bytes
        rec["dear_tuned"] = model.tuner.chosen is not None
    return rec


def _stats(tracked: Tracked | None) -> tuple[float, ...]:
    """The hook's counters so far, and the transport's time split of its switch time."""
    if tracked is None:
        return (0,) * 4 + (0.0,) * 5
    s = tracked.inner.stats
    agent = tracked.inner.agent
    t = agent.transport.stats if agent is not None and agent.transport is not None else None
    return (
        s.wire_bytes,
        s.dense_bytes,
        s.retransmissions,
        s.fallback_buckets,
        s.switch_seconds,
        s.agreement_seconds,
        t.encode_seconds if t else 0.0,
        t.exchange_seconds if t else 0.0,
        t.decode_seconds if t else 0.0,
    )


def codec_options(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings as codec options: numbers as int or float, true/false as bool,
    anything else as a string (gamma=0 -> {"gamma": 0})."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"codec option {pair!r}: expected KEY=VALUE")
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def _progress(mode: str, steps: int, r: dict[str, Any]) -> str:
    ratio = r["tx_bytes"] / r["dense_bytes"] if r["dense_bytes"] else math.nan
    extra = (
        f"  retx {r['retransmissions']}  fallback buckets {r['fallback_buckets']}"
        if mode == "switch"
        else ""
    )
    return (
        f"[{mode:6}] step {r['step'] + 1:4}/{steps}  loss {r['loss']:.4f}"
        f"  {r['seconds'] * 1e3:7.1f} ms"
        f"  wire {r['tx_bytes'] / 1e3:8.1f} kB/rank = {ratio:5.2f}x dense{extra}"
    )


def main(argv: list[str] | None = None) -> None:
    """Command line (one rank; torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mode", choices=peers.MODES, required=True)
    p.add_argument("--codec", default="lossless", help="a codec, or auto (delay-aware)")
    p.add_argument("--codec-option", action="append", default=[], help="KEY=VALUE, for the codec")
    p.add_argument(
        "--overlap",
        choices=["blocking", "async", "dear"],
        default="blocking",
        help="switch run: blocking hook, asynchronous hook, or DeAR mode (default blocking)",
    )
    p.add_argument("--model", choices=MODELS, default="ncf")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--users", type=int, default=20000)
    p.add_argument("--items", type=int, default=4000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="SGD learning rate (default: per model)")
    p.add_argument("--controller", default="", help="default: $HOMAGG_CONTROLLER")
    p.add_argument("--pool-size", type=int, default=0, help="switch slots (0: the default)")
    p.add_argument("--iface", required=True, help="the host's interface (bytes sent)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    warnings.simplefilter("default")
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        train(a)
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
