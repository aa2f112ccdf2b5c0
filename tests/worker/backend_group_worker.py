"""One rank of test_backend.py's new_group case: under the homagg backend, a
`dist.new_group()` is a switch job of its own beside the world's (its own UDP port, taken
before it joins); all_reduces on both groups go through the switch, exactly; a
`new_group(backend="gloo")` is no job. Writes a JSON report (argv[1])."""

import json
import sys

import torch
import torch.distributed as dist

import homagg

dist.init_process_group("homagg")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.new_group(list(range(world)))  # the default backend: homagg, a second job
plain = dist.new_group(backend="gloo")
checks = {}
for name, g in (("world", None), ("group", group), ("gloo", plain)):
    x = torch.arange(-500, 500, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(x, group=g)
    checks[f"{name} int sum"] = torch.equal(x, torch.arange(-500, 500, dtype=torch.int32) * 3)
    y = torch.linspace(-1, 1, 4000) * (rank + 1)
    dist.all_reduce(y, group=g)
    checks[f"{name} float sum"] = torch.allclose(y, torch.linspace(-1, 1, 4000) * 3, atol=1e-5)
pgs = [homagg.switch_group(), homagg.switch_group(group)]
report = {
    "checks": checks,
    "switch": [pg.state.stats.switch_buckets for pg in pgs],
    "fallbacks": [pg.state.stats.fallbacks for pg in pgs],
    "ports": [pg.state.agent.udp_port for pg in pgs],
    "jobs": [pg.state.agent.config.job_id for pg in pgs],
    "gloo_is_plain": not isinstance(plain, homagg.SwitchProcessGroup),
}
dist.barrier()
dist.destroy_process_group()
with open(sys.argv[1], "w") as f:
    json.dump(report, f)
