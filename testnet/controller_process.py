"""`aggctl serve` as a process of its own, so a test can kill it (SIGKILL, by PID) and
start it again on the same database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from controller.client import ControllerClient
from testnet.poll import wait_for


def config_toml(doc: dict) -> str:
    """A controller configuration document ({"controller": {...}, "switch": [{...}]}, and
    optionally "operator": [{...}]) as TOML."""

    def value(v: object) -> str:
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return str(v).lower() if isinstance(v, bool) else str(v)

    lines = ["[controller]"] + [f"{k} = {value(v)}" for k, v in doc["controller"].items()]
    for sw in doc["switch"]:
        lines += ["", "[[switch]]"] + [f"{k} = {value(v)}" for k, v in sw.items()]
    for op in doc.get("operator", []):
        lines += ["", "[[operator]]"] + [f"{k} = {value(v)}" for k, v in op.items()]
    return "\n".join(lines) + "\n"


def write_toml(doc: dict, path: Path) -> Path:
    """Write config_toml(doc) to path; returns path."""
    path.write_text(config_toml(doc))
    return path


class ControllerProcess:
    """`python -m controller serve --config CONFIG` listening on `address`; kill() is SIGKILL by
    PID."""

    def __init__(self, config: Path, address: str, log: Path, *extra_args: str) -> None:
        self.config, self.address, self.log = config, address, log
        self.extra_args = extra_args
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> ControllerClient:
        """Start it and wait until it serves and every switch is connected; returns a client."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "controller",
                    "serve",
                    "--config",
                    str(self.config),
                    "--insecure",  # a test's plaintext controller on loopback
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        client = ControllerClient(self.address, timeout=2.0)

        def synced() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return all(s.connected for s in client.status().switches)
            except Exception:
                return False

        wait_for(synced, timeout, "the controller process to serve and sync")
        return client

    def kill(self) -> None:
        """SIGKILL its process group (it leads its own session) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
