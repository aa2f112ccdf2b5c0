"""homagg's public Python API for training scripts: `attach(ddp_model)` puts a torchrun/DDP
job's gradients on the switch (worker/attach.py). Importing homagg also registers the
torch.distributed backend "homagg" (worker/backend.py): `dist.init_process_group("homagg")`
puts every all_reduce the switch can do on it, DDP without a hook included.
`homagg-run -- torchrun ...` (worker/launch.py, python -m worker.launch) creates the job
around a torchrun; it lives outside this package so that it starts without importing torch."""

from worker.attach import CODEC_CHOICES, attach
from worker.backend import BACKEND_NAME, SwitchProcessGroup, switch_group
from worker.backend import register as register_backend

__all__ = [
    "BACKEND_NAME",
    "CODEC_CHOICES",
    "SwitchProcessGroup",
    "attach",
    "register_backend",
    "switch_group",
]
