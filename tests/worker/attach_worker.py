"""One rank of test_attach_fabric.py (inside its host namespace, torchrun's environment):
attach, train, destroy the process group (the job ends there, not at exit), then a new
process group with two models attached at once (asynchronous; codec "auto"), train, destroy.
Writes a JSON report (argv[1]) of what each phase saw."""

import atexit
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg
from homagg.api.client import ControllerClient
from homagg.worker.job import session as job_session


def model(seed: int) -> DDP:
    torch.manual_seed(seed)
    return DDP(nn.Sequential(nn.Embedding(300, 8, sparse=True), nn.Flatten(), nn.Linear(16, 1)))


def train(ddp: DDP, rank: int, steps: int) -> None:
    params = list(ddp.parameters())
    dense, sparse = params[1:], params[:1]
    opts = [torch.optim.SGD(dense, lr=0.1), torch.optim.SGD(sparse, lr=0.1)]
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randint(0, 300, (16, 2), generator=g)
        for o in opts:
            o.zero_grad()
        ddp(x).square().mean().backward()
        for o in opts:
            o.step()


def job_states(ids: list[int]) -> list[str]:
    with ControllerClient(os.environ["HOMAGG_CONTROLLER"], 5.0) as c:
        jobs = {j.job_id: j.state for j in c.list_jobs(include_ended=True).jobs}
    return [jobs[i] for i in ids]


def main() -> None:
    rank = int(os.environ["RANK"])
    report: dict = {}
    dist.init_process_group("gloo")
    idle, ddp = model(0), model(1)
    first = homagg.attach(idle)  # two jobs of one process group at once (two UDP ports)
    state = homagg.attach(ddp)
    assert first.agent is not None and state.agent is not None
    train(ddp, rank, 3)
    jobs = [first.agent.config.job_id, state.agent.config.job_id]
    report["ports"] = [first.agent.udp_port, state.agent.udp_port]
    report["first"] = {"switch": state.stats.switch_buckets, "fallbacks": state.stats.fallbacks}
    dist.barrier()
    dist.destroy_process_group()  # rank 0 releases both jobs here, not at exit
    report["after_destroy"] = {
        "agents_closed": [first.agent is None, state.agent is None],
        "sessions": len(job_session._sessions),
        "jobs": job_states(jobs) if rank == 0 else [],
    }
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
    dist.init_process_group("gloo")
    a, b = model(2), model(3)
    exits = atexit._ncallbacks()  # type: ignore[attr-defined]  # (imports are done)
    sa = homagg.attach(a, asynchronous=True)
    sb = homagg.attach(b, "auto")
    report["atexit_added"] = atexit._ncallbacks() - exits  # type: ignore[attr-defined]
    train(a, rank, 4)
    train(b, rank, 4)
    sa.wait_idle(30)
    sb.wait_idle(30)
    assert sa.agent is not None and sb.agent is not None
    again = [sa.agent.config.job_id, sb.agent.config.job_id]
    report["again"] = {
        "switch": [sa.stats.switch_buckets, sb.stats.switch_buckets],
        "fallbacks": [sa.stats.fallbacks, sb.stats.fallbacks],
        "asynchronous": [sa.asynchronous, sb.asynchronous],
        "auto_choices": dict(sb.stats.auto_choices),
        "codecs": [sa.codec_name, sb.codec_name],
    }
    dist.barrier()
    dist.destroy_process_group()
    report["again"]["jobs"] = job_states(again) if rank == 0 else []
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
