"""One rank of test_auto_control.py (a subprocess): DDP with the asynchronous hook and
codec="auto" over a switch simulated by gloo collectives (ADD/OR/MAX of the codec's int32
cells, the switch's semantics), with a per-cell delay injected during a window of steps
(a slow link). Saves the controller's per-step choices and the hook's stats."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from homagg.wire.constants import Op
from homagg.worker.auto.control import AutoConfig
from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook
from homagg.worker.transport.switch_transport import TransportConfig, TransportStats

_OPS = {Op.ADD: dist.ReduceOp.SUM, Op.OR: dist.ReduceOp.BOR, Op.MAX: dist.ReduceOp.MAX}


class GlooSwitch:
    """A transport whose 'switch' is an all_reduce per phase on its own group; sleeps
    `delay_per_cell` seconds per cell sent (the injected delay)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.next_chunk = 0
        self.stats = TransportStats()
        self.config = TransportConfig(job_id=1, rank=0, world_size=1, pool_size=1)
        self.delay_per_cell = 0.0

    def run(self, gen):
        phase = next(gen)
        while True:
            t = torch.from_numpy(phase.cells.copy())
            time.sleep(self.delay_per_cell * t.numel())
            dist.all_reduce(t, op=_OPS[Op(phase.op)], group=self.group)
            self.stats.packets_sent += 1
            try:
                phase = gen.send(t.numpy())
            except StopIteration as done:
                return done.value


@dataclass
class Agent:
    transport: GlooSwitch
    healthy: bool = True
    unhealthy_reason: str = ""
    extra: dict = field(default_factory=dict)


class SlowForward(nn.Module):
    """A model whose forward takes a fixed time: the compute the budget is made of."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.3)
        return self.net(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--slow", default="10:30", help="FIRST:END steps with the injected delay")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO)  # the controller's per-step log, for failures
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(a.store, 2),
        rank=a.rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    switch = GlooSwitch(dist.new_group(backend="gloo"))
    torch.manual_seed(0)
    model = DDP(SlowForward(), bucket_cap_mb=0.01)
    state = SwitchHookState(
        Agent(switch), codec="auto", auto=AutoConfig(tolerance=0.5, decrease=0.1)
    )
    model.register_comm_hook(state, switch_allreduce_hook)
    host_all_reduce = state.host_all_reduce

    def slow_host(buf: torch.Tensor) -> None:  # the slow link slows the host path alike
        time.sleep(switch.delay_per_cell * buf.numel())
        host_all_reduce(buf)

    state.host_all_reduce = slow_host  # type: ignore[method-assign]
    host_all_reduce_async = state.host_all_reduce_async

    hook_threads: list[str] = []

    def slow_host_async(buf: torch.Tensor) -> dist.Work:  # codec="auto"'s host buckets
        hook_threads.append(threading.current_thread().name)
        time.sleep(switch.delay_per_cell * buf.numel())
        return host_all_reduce_async(buf)

    state.host_all_reduce_async = slow_host_async  # type: ignore[method-assign]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first, end = (int(v) for v in a.slow.split(":"))
    gen = torch.Generator().manual_seed(a.rank)
    for step in range(a.steps):
        # rank 1's link is slower than rank 0's: only agreed numbers may decide
        switch.delay_per_cell = (100e-6 * (1 + a.rank)) if first <= step < end else 0.0
        opt.zero_grad()
        x = torch.randn(32, 64, generator=gen)
        model(x).square().mean().backward()
        opt.step()
    state.wait_idle(30)
    assert state.controller is not None
    out = {
        "history": [{str(k): v for k, v in h.items()} for h in state.controller.history],
        "choices": dict(state.stats.auto_choices),
        "host_buckets": state.stats.host_buckets,
        "host_from": sorted(set(hook_threads)),  # the threads that issued them
        "host_issued": len(hook_threads),
        "fallback_buckets": state.stats.fallback_buckets,
    }
    state.close()
    with open(a.out, "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    # torch's gloo now and then aborts in the interpreter's teardown, after all of the
    # above ("terminate called without an active exception", no Python frame left; plain
    # torch DDP scripts do it too): the rank's work is done and written, leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
