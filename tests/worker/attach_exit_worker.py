"""One rank of test_attach_exit.py (inside its host namespace, torchrun's environment): attach,
train, and end without `dist.destroy_process_group`. argv: MODE REPORT.

exit: both ranks train, meet at a barrier, then rank 0 fails with an exception and rank 1
returns: the job ends at exit (job_session's atexit handler), not by its lease.
killed: rank 1 kills itself (SIGKILL) before its backward at step 3, after writing the time
to REPORT.killed; rank 0 reports how its step ended (the error, after how long, why its
agent is unhealthy) to REPORT, then exits without destroying the group."""

import json
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg

STEPS, KILL_AT = 6, 3


def main() -> None:
    mode, report = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Embedding(300, 8, sparse=True), nn.Flatten(), nn.Linear(16, 1)))
    state = homagg.attach(ddp)
    assert state.agent is not None, state.unavailable_reason
    with open(f"{report}.job", "w") as f:
        f.write(str(state.agent.config.job_id))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        loss = ddp(torch.randint(0, 300, (16, 2), generator=g)).square().mean()
        if mode == "killed" and rank == 1 and step == KILL_AT:
            with open(f"{report}.killed", "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            opt.zero_grad()
            loss.backward()
        except Exception as exc:  # killed: rank 0's step cannot end
            done = {
                "error": "".join(traceback.format_exception_only(exc)),
                "at": time.time(),
                "step": step,
                "reason": state.local_reason(),
                "switch_buckets": state.stats.switch_buckets,
            }
            with open(report, "w") as f:
                json.dump(done, f)
            return  # without destroy_process_group
        opt.step()
    dist.barrier()
    if rank == 0:
        raise RuntimeError("the script fails here, without destroy_process_group")


if __name__ == "__main__":
    main()
