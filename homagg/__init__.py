"""homagg: in-network gradient aggregation on P4 switches.

For training scripts: `homagg.attach(ddp_model)` puts a torchrun/DDP job's gradients on the
switch (homagg/worker/ddp/attach.py), and `dist.init_process_group("homagg")` puts every
all_reduce the switch can do on it (homagg/worker/ddp/backend.py). Importing homagg does not
import torch: the controller, the switches and `homagg-run` start without it. The names below
load on first use, and the backend is registered as soon as torch.distributed is imported
(now, if it already is).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

BACKEND_NAME = "homagg"

_LAZY = {
    "attach": "homagg.worker.ddp.attach",
    "CODEC_CHOICES": "homagg.worker.ddp.attach",
    "SwitchProcessGroup": "homagg.worker.ddp.backend",
    "switch_group": "homagg.worker.ddp.backend",
}

__all__ = ["BACKEND_NAME", "register_backend", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'homagg' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    return getattr(module, name)


def _create_process_group(*args: Any, **kwargs: Any) -> Any:
    """torch.distributed's creator for the backend; the backend's module loads here."""
    return importlib.import_module("homagg.worker.ddp.backend").create(*args, **kwargs)


def register_backend() -> None:
    """Register the "homagg" torch.distributed backend (idempotent; importing homagg does it
    once torch.distributed is imported)."""
    # torch.distributed may still be part of torch's own import here: touch nothing else of torch
    dist = sys.modules.get("torch.distributed") or importlib.import_module("torch.distributed")
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["cpu"])


class _LoaderThenRegister(importlib.abc.Loader):
    """torch.distributed's own loader, then the backend's registration."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        register_backend()

    def __getattr__(self, name: str) -> Any:
        # the rest of the loader's interface (get_source, is_package, resource readers)
        return getattr(self._loader, name)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers the backend right after torch.distributed is imported, once."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderThenRegister(spec.loader)
        return spec


if "torch.distributed" in sys.modules:
    register_backend()
elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterOnImport())
