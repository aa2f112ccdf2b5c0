"""Which I/O path a transport takes: "batched" (whole batches of chunks per system call,
packed and parsed with numpy, timers per batch: homagg/worker/transport/batched_exchange.py)
or "python" (one datagram at a time: the reference, and the tests' oracle). Chosen by
TransportConfig.io_path, else HOMAGG_TRANSPORT_IO, else batched."""

from __future__ import annotations

import os

from homagg.environment import TRANSPORT_IO_ENV

BATCHED = "batched"
PYTHON = "python"
IO_PATHS = (BATCHED, PYTHON)
DEFAULT_IO_PATH = BATCHED


def resolve_io_path(asked: str = "") -> str:
    """The path to take: `asked` (a TransportConfig's io_path), else the environment's, else
    the default; a ValueError that names the choices for anything else."""
    chosen = asked or os.environ.get(TRANSPORT_IO_ENV, "") or DEFAULT_IO_PATH
    if chosen not in IO_PATHS:
        where = "TransportConfig.io_path" if asked else TRANSPORT_IO_ENV
        raise ValueError(f"{where} must be one of {', '.join(IO_PATHS)}, not {chosen!r}")
    return chosen
