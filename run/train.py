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
(homagg/worker/ddp/attach.py).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.

import argparse
import gc
import json
import logging
import math
import os
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Before init_process_group: this module's functions take `group=group.WORLD` as a default
# argument, evaluated at import. DDP imports it (through torch.distributed._shard); imported
# after init, its defaults keep the world group alive past destroy_process_group, and gloo's
# threads and the TCPStore are then torn down inside interpreter finalization (issue 31's
# "terminate called without an active exception"). Imported here, its defaults are None.
import torch.distributed.nn
from torch.nn.parallel import DistributedDataParallel as DDP

from homagg.environment import LOG_ENV
from homagg.worker.codecs import AUTO_CODEC, DEFAULT_CODEC
from homagg.worker.ddp.attach import attach
from homagg.worker.ddp.dear import DearDataParallel
from homagg.worker.ddp.hook import SwitchHookState
from run import peers
from run.comm_timer import AllreduceTimer
from run.model import DEFAULT_LR, MODELS, JobShape, make_task
from run.options import BLOCKING, DEAR, OVERLAP_MODES, codec_options


class LocalGradMax:
    """The largest |local gradient| this step (before any aggregation; its exponent bounds
    every block exponent the codec agrees on: docs/codecs.md), from parameter hooks."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.value = 0.0
        for p in module.parameters():
            if p.requires_grad:
                p.register_hook(self._see)

    def _see(self, grad: torch.Tensor) -> None:
        self.value = max(self.value, _grad_max(grad))

    def take(self) -> float:
        """This step's maximum; the next step starts from 0."""
        value, self.value = self.value, 0.0
        return value


def _grad_max(grad: torch.Tensor) -> float:
    """Largest |element| of a gradient, dense or sparse (sparse embeddings: its values)."""
    values = grad.coalesce().values() if grad.is_sparse else grad
    return float(values.abs().max()) if values.numel() else 0.0


def tx_bytes(iface: str) -> int:
    """Bytes this host sent on its interface (everything: aggregation, gloo, control)."""
    return int(Path(f"/sys/class/net/{iface}/statistics/tx_bytes").read_text())


OVERLAP_BUCKET_MB = 0.25  # the asynchronous hook's DDP buckets (DeAR's smallest candidate)


def _bucket_mb(overlap: bool) -> float | None:
    """DDP's bucket size: its default (25 MiB, the first 1 MiB: one bucket for our models,
    as DDP over gloo has them), or for the asynchronous hook with a fixed codec 256 KiB, so
    that the first buckets aggregate while backward produces the others. codec="auto" keeps
    the default: its host path then issues exactly gloo's all_reduces."""
    return OVERLAP_BUCKET_MB if overlap else None


def train(a: argparse.Namespace) -> None:
    """Run the job on this rank; rank 0 writes <out>/<mode>.jsonl and <out>/<mode>.pt."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    shape = JobShape(users=a.users, items=a.items, dim=a.dim, batch=a.batch)
    task = make_task(a.model, shape)
    peers.prepare(a.mode, task.model)  # before DDP: it reads which gradients are sparse
    dear = a.mode == "switch" and a.overlap == DEAR
    overlap = a.mode == "switch" and a.overlap == "async" and a.codec != AUTO_CODEC
    model = task.model if dear else DDP(task.model, bucket_cap_mb=_bucket_mb(overlap))
    state: SwitchHookState | None = None
    # every mode pays the same hooks, so that the iteration times compare (the switch's
    # records need the value; the others' report it too)
    grad_max = LocalGradMax(task.model)
    lr = a.lr if a.lr is not None else DEFAULT_LR[a.model]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if a.mode == "switch":
        model, state = _attach_switch(a, task, model, opt, dear)
    out = Path(a.out)
    # closed in the finally below (rank 0 only writes the step records)
    log = open(out / f"{a.mode}.jsonl", "w") if rank == 0 else None  # noqa: SIM115
    dense = sum(p.numel() for p in model.parameters()) * 4
    if a.mode not in ("switch", "gloo"):
        assert isinstance(model, DDP)  # the peer methods are DDP comm hooks
        peers.attach(a.mode, model, a.steps)  # DDP keeps the hook's state
    timer = AllreduceTimer()  # DDP over gloo's all_reduce time (dense gradients: comm hooks)
    if a.mode == "gloo" and isinstance(model, DDP) and not task.sparse:
        timer.attach(model)
    try:
        rows: list[list[float]] = []
        snaps: list[dict[str, Any]] = []
        for step in range(a.steps):
            rows.append(_timed_step(a, task, model, opt, state, grad_max, step, timer))
            if rank == 0:  # rank 0's own numbers now (so labelled); the means over the ranks
                # are agreed and written at the end
                snaps.append(_snapshot(model, state))
                local = _record(step, torch.tensor(rows[-1]), 1, dense, rows[-1][3], snaps[-1])
                print(_progress(a.mode, a.steps, local), flush=True)
        # Agreed once, after the last step: nothing runs between the timed steps, so no
        # aggregation left running in the background (DeAR, the communication thread)
        # finishes in untimed time.
        records = _agreed(rows)
        if log is not None:
            for step, (t, m) in enumerate(records):
                rec = _record(step, t, world_size, dense, m, snaps[step])
                log.write(json.dumps(rec) + "\n")
        if rank == 0:
            torch.save(
                {k: v.detach().clone() for k, v in task.model.state_dict().items()},
                out / f"{a.mode}.pt",
            )
    finally:
        if log is not None:
            log.close()
        _close(model, state)
    if state is not None and state.controller is not None:  # every rank: compared after
        history = [{str(k): v for k, v in h.items()} for h in state.controller.history]
        (out / f"auto-rank{rank}.json").write_text(json.dumps(history))


def _attach_switch(
    a: argparse.Namespace, task: Any, model: Any, opt: torch.optim.Optimizer, dear: bool
) -> tuple[Any, SwitchHookState]:
    """homagg.attach on the DDP model (or DeAR around the bare one): (the model to train,
    the hook state)."""
    # One support key per embedding row: the index phase shrinks dim-fold.
    opts: dict[str, Any] = {"support_block": a.dim} if task.sparse else {}
    auto = a.codec == AUTO_CODEC  # --codec-option sets its controller, not a codec
    if auto:  # per codec name; the sparse rows' key for lossless only
        opts = {"lossless": opts}
    else:
        opts = {**(opts if a.codec == "lossless" else {}), **codec_options(a.codec_option)}
    state = attach(
        None if dear else model,  # DeAR takes the state itself
        a.codec,
        asynchronous=a.overlap != BLOCKING,
        codec_options=opts,
        auto_options=codec_options(a.codec_option) if auto else None,
        controller=a.controller or None,
        pool_size=a.pool_size,
        name="make-run",
    )
    if dear:
        model = DearDataParallel(task.model, opt, state, tune_steps=2)
    return model, state


def _timed_step(
    a: argparse.Namespace,
    task: Any,
    model: Any,
    opt: torch.optim.Optimizer,
    state: SwitchHookState | None,
    grad_max: LocalGradMax,
    step: int,
    timer: AllreduceTimer,
) -> list[float]:
    """One training step, timed: this rank's loss, seconds, bytes sent, largest |local
    gradient|, the hook's counters during the step and the seconds of DDP's timed
    all_reduces and of the rank's CPU, every thread of its process (the numbers _agreed
    sums)."""
    start, sent, reduced = time.perf_counter(), tx_bytes(a.iface), timer.seconds
    cpu = time.process_time()
    before = _stats(state)
    *inputs, labels = task.batch(dist.get_rank(), step)
    opt.zero_grad()
    loss = task.loss(model(*inputs), labels)
    loss.backward()
    if isinstance(model, DearDataParallel):  # DeAR steps in the next forward
        if step == a.steps - 1:
            model.flush()
    else:
        opt.step()
    seconds = time.perf_counter() - start
    wire = tx_bytes(a.iface) - sent
    after = _stats(state)
    local_max = grad_max.take()
    return [
        loss.item(),
        seconds,
        float(wire),
        local_max,
        *(float(x - y) for x, y in zip(after, before)),
        timer.seconds - reduced,
        time.process_time() - cpu,
    ]


def _agreed(rows: list[list[float]]) -> list[tuple[torch.Tensor, float]]:
    """Every step's numbers (_timed_step's rows) summed over the ranks, and the largest
    |local gradient| of any rank (column 3), per step: two all_reduces for the whole run
    (after it, not between its steps)."""
    t = torch.tensor(rows, dtype=torch.float64)
    m = t[:, 3].clone() if rows else torch.zeros(0, dtype=torch.float64)
    dist.all_reduce(t)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return [(t[i], float(m[i])) for i in range(len(rows))]


def _record(
    step: int, t: torch.Tensor, world_size: int, dense: int, grad_max: float, snap: dict[str, Any]
) -> dict[str, Any]:
    """A step's JSON record from the numbers `t` summed over `world_size` ranks (_agreed's;
    rank 0's own with world_size 1) and rank 0's snapshot of the model and the hook."""
    return {
        "step": step,
        "loss": float(t[0]) / world_size,
        "seconds": float(t[1]) / world_size,
        "tx_bytes": float(t[2]) / world_size,
        "dense_bytes": dense,
        "agg_wire": float(t[4]) / world_size,
        "agg_dense": float(t[5]) / world_size,
        "retransmissions": int(t[6]),
        "fallback_buckets": int(t[7]),
        "switch_seconds": float(t[8]) / world_size,
        "agreement_seconds": float(t[9]) / world_size,
        # the switch_seconds split (homagg/worker/transport/switch_transport.py): codec, exchanges
        "encode_seconds": float(t[10]) / world_size,
        "wait_seconds": float(t[11]) / world_size,
        "decode_seconds": float(t[12]) / world_size,
        # what the switch handled this step: every rank's contributions (resends included)
        # and the results it sent each rank
        "switch_packets": int(t[13] + t[14]),
        # DDP over gloo's all_reduces in flight (dense models' gloo runs; 0 elsewhere)
        "allreduce_seconds": float(t[15]) / world_size,
        # CPU of every rank's process in the step, summed: with more ranks than cores on
        # one machine, the step lasts at least this over the cores
        "cpu_seconds": float(t[16]),
        "grad_max": grad_max,
        **snap,
    }


def _close(model: Any, state: SwitchHookState | None) -> None:
    """Stop DeAR or the hook's communication thread; the job ends at destroy_process_group
    (main)."""
    if isinstance(model, DearDataParallel):
        model.close()
    elif state is not None:
        state.close()


def _snapshot(model: Any, state: SwitchHookState | None) -> dict[str, Any]:
    """Rank 0's view after a step: the largest |parameter|, codec="auto"'s choices so far
    (every rank makes the same ones), DeAR's bucket size and its tuning measurements."""
    rec: dict[str, Any] = {
        "param_max": max(float(p.detach().abs().max()) for p in model.parameters())
    }
    if state is not None and state.controller is not None:
        rec["auto_choices"] = dict(state.stats.auto_choices)
        rec["host_buckets"] = state.stats.host_buckets
        rec["leased_steps"] = state.stats.leased_steps
    if isinstance(model, DearDataParallel):
        rec["dear_bucket_bytes"] = model.bucket_bytes
        rec["dear_tuned"] = model.tuner.chosen is not None
        if model.tuner.chosen is not None:
            rec["dear_tuning"] = {str(k): v for k, v in model.tuner.report().items()}
    return rec


def _stats(state: SwitchHookState | None) -> tuple[float, ...]:
    """The hook's counters so far, the transport's time split of its switch time, and the
    packets it sent to the switch and the results it received."""
    if state is None:
        return (0,) * 4 + (0.0,) * 5 + (0, 0)
    s = state.stats
    agent = state.agent
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
        t.packets_sent if t else 0,
        t.results if t else 0,
    )


def _progress(mode: str, steps: int, r: dict[str, Any]) -> str:
    ratio = r["tx_bytes"] / r["dense_bytes"] if r["dense_bytes"] else math.nan
    extra = (
        f"  retx {r['retransmissions']}  fallback buckets {r['fallback_buckets']}"
        if mode == "switch"
        else ""
    )
    return (
        f"[{mode:6}] step {r['step'] + 1:4}/{steps}  rank 0: loss {r['loss']:.4f}"
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
    p.add_argument("--codec", default=DEFAULT_CODEC, help="a codec, or auto (delay-aware)")
    p.add_argument("--codec-option", action="append", default=[], help="KEY=VALUE, for the codec")
    p.add_argument(
        "--overlap",
        choices=OVERLAP_MODES,
        default=BLOCKING,
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
    # HOMAGG_LOG=INFO: the hook's log in each rank's log (auto's per-step decisions)
    logging.basicConfig(level=os.environ.get(LOG_ENV, "WARNING").upper())
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        train(a)
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        # DDP and its hook's state sit in reference cycles that hold the world group: freed
        # first, destroy_process_group drops the group's last reference and stops gloo's and
        # the store's threads here, not in interpreter finalization
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
