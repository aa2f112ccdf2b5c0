"""homagg's public Python API for training scripts: `attach(ddp_model)` puts a torchrun/DDP
job's gradients on the switch (worker/attach.py); `connect()` does the same set-up without
a model. `python -m homagg.launch -- torchrun ...` creates the job around a torchrun."""

from worker.attach import attach, connect

__all__ = ["attach", "connect"]
