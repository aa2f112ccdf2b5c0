"""homagg's public Python API for training scripts: `attach(ddp_model)` puts a torchrun/DDP
job's gradients on the switch (worker/attach.py); `connect()` does the same set-up without
a model. Importing homagg also registers the torch.distributed backend "homagg"
(worker/backend.py): `dist.init_process_group("homagg")` puts every all_reduce the switch
can do on it, DDP without a hook included. `python -m homagg.launch -- torchrun ...`
creates the job around a torchrun."""

from worker.attach import attach, connect
from worker.backend import BACKEND_NAME, SwitchProcessGroup, switch_group
from worker.backend import register as register_backend

__all__ = [
    "BACKEND_NAME",
    "SwitchProcessGroup",
    "attach",
    "connect",
    "register_backend",
    "switch_group",
]
