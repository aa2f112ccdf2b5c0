"""One rank of the training tests (run as a subprocess by test_ddp_hook_training.py): trains
a small model with an embedding for a few steps under plain DDP (gloo) and under the switch
hook for each given job, and saves the final parameters and the hook's stats.

gloo runs over loopback in the root namespace (a FileStore rendezvous); only the agent's UDP
socket lives in the rank's host namespace, so killing the switch leaves gloo intact."""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from homagg.lab.addresses import host_ip, host_mac, host_switch_port
from homagg.lab.namespace import in_namespace
from homagg.worker.ddp.dear import DearDataParallel
from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook
from homagg.worker.job.agent import AgentConfig, WorkerAgent

STEPS = 10
# With --kill-dir: each retry of the killed switch spends a retry budget at the backed-off
# timeout, and the first also dead_path_s of silence: 0.1 s and 1 s (defaults 0.5 s, 3 s).
KILLED_TIMING = {"max_timeout": 0.1, "dead_path_s": 1.0}


class Model(nn.Module):
    """An embedding (rows touched per batch: sparse-ish gradients) and a small MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(300, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(idx).mean(dim=1))


def train_dear(rank: int, state: SwitchHookState) -> dict[str, torch.Tensor]:
    """The same training in DeAR mode (buckets of ~1000 floats, fixed size)."""
    torch.manual_seed(0)
    module = Model()
    dear = DearDataParallel(
        module, torch.optim.SGD(module.parameters(), lr=0.5), state, bucket_bytes=4000
    )
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        idx = torch.randint(0, 300, (16, 5), generator=gen)
        target = torch.randn(16, 4, generator=gen)
        nn.functional.mse_loss(dear(idx), target).backward()
    dear.flush()
    dear.close()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def train(
    rank: int, state: SwitchHookState | None, kill_dir: Path | None = None
) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = DDP(Model(), bucket_cap_mb=0.004)  # several buckets of ~1000 floats
    if state is not None:
        model.register_comm_hook(state, switch_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        idx = torch.randint(0, 300, (16, 5), generator=gen)
        target = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(idx), target).backward()
        opt.step()
        if kill_dir is not None and step == 2:
            dist.barrier()
            if rank == 0:
                (kill_dir / "kill-me").write_text("")
            deadline = time.monotonic() + 20
            while not (kill_dir / "killed").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            dist.barrier()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--controller", required=True)
    p.add_argument("--netns", required=True)
    p.add_argument(
        "--job", action="append", default=[], help="CODEC[/async|/dear]:JOB_ID:TOKEN:UDP_PORT"
    )
    p.add_argument("--kill-dir", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(a.store, a.world),
        rank=a.rank,
        world_size=a.world,
        timeout=timedelta(seconds=60),
    )
    results: dict = {"plain": train(a.rank, None)}
    stats: dict = {}

    def sock() -> socket.socket:
        with in_namespace(a.netns):
            return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    for spec in a.job:
        name, job_id, token, port = spec.split(":")
        codec, _, mode = name.partition("/")
        cfg = AgentConfig(
            controller=a.controller,
            job_id=int(job_id),
            token=token,
            rank=a.rank,
            ip=host_ip(a.rank),
            udp_port=int(port),
            switch_port=host_switch_port(a.rank),
            mac=host_mac(a.rank),
            max_retries=4,
            **(KILLED_TIMING if a.kill_dir else {}),
            ready_timeout=30,
            insecure=True,  # the test's controller serves plaintext
        )
        with WorkerAgent(cfg, sock) as agent, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = SwitchHookState(
                agent, codec=codec, cooldown_steps=2, asynchronous=mode == "async"
            )
            start = time.monotonic()
            if mode == "dear":
                results[name] = train_dear(a.rank, state)
            else:
                results[name] = train(a.rank, state, Path(a.kill_dir) if a.kill_dir else None)
                state.close()
            homagg = [str(w.message) for w in caught if "homagg" in str(w.message)]
            s = state.stats
            stats[name] = {
                "switch_buckets": s.switch_buckets,
                "fallback_buckets": s.fallback_buckets,
                "fallbacks": s.fallbacks,
                "warnings": homagg,
                "seconds": time.monotonic() - start,
                "wire_bytes": s.wire_bytes,
                "dense_bytes": s.dense_bytes,
            }
    torch.save(results, a.out)
    Path(a.out + ".json").write_text(json.dumps(stats))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
