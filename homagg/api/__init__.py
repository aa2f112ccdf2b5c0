"""The controller's gRPC API: jobs.proto, and the modules generated from it at build time by
homagg/api/generate.py (docs/controller.md describes every call).

`from homagg.api import jobs_pb2, jobs_pb2_grpc` imports the generated modules, or says
how to build them; the package itself imports nothing, so the generator runs without them.
"""

import importlib
from types import ModuleType

GENERATED = ("jobs_pb2", "jobs_pb2_grpc")


def __getattr__(name: str) -> ModuleType:
    if name not in GENERATED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        raise ImportError(
            "the controller's gRPC modules are not generated yet: run `make venv` "
            "(or `python -m homagg.api.generate`)"
        ) from exc
