"""One rank of test_auto_link.py (inside its host namespace, torchrun's environment): DDP
with homagg.attach(codec="auto") through the reference switch, a forward that takes a fixed
time (the compute that hides the aggregation), and this host's link to the switch shaped
by a tc token bucket for a window of steps (a slow link: every packet the host sends, the
switch path's and gloo's alike, waits for its tokens). Writes the controller's per-step
choices and the hook's stats as JSON (argv: OUT STEPS FIRST END RATE)."""

import json
import logging
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg

COMPUTE_S = 0.8  # the forward's time: the iteration the budget's tolerance is a share of


class Timed(nn.Module):
    """Two 128 x 128 layers (33k parameters, 132 kB of gradients) behind a fixed delay."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(COMPUTE_S)
        return self.net(x)


def tc(*args: str) -> None:
    subprocess.run(["tc", "qdisc", *args], check=True, capture_output=True)


def main() -> None:
    out, steps, first, end, rate = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    iface = os.environ["HOMAGG_IFACE"]
    logging.basicConfig(level=logging.INFO)  # the controller's per-step log, for failures
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Timed())
    state = homagg.attach(model, "auto")
    assert state.controller is not None
    state.controller.config.tolerance = 0.5  # a share of the iteration may stay exposed
    state.controller.config.decrease = 0.25  # back to exact within a few steps of slack
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(steps):
        if step == first:
            tc(*f"replace dev {iface} root tbf rate {rate} burst 16kb latency 5s".split())
        if step == end:
            tc("del", "dev", iface, "root")
        opt.zero_grad()
        model(torch.randn(32, 128, generator=g)).square().mean().backward()
        opt.step()
    state.wait_idle(60)
    report = {
        "history": [{str(k): v for k, v in h.items()} for h in state.controller.history],
        "choices": dict(state.stats.auto_choices),
        "switch": state.stats.switch_buckets,
        "host": state.stats.host_buckets,
        "fallbacks": state.stats.fallbacks,
    }
    state.close()
    with open(out, "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
