"""`aggctl serve` as a process of its own, started and awaited one way for tests (which
kill it by PID and start it again on the same database) and for `make run` (on TLS)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from homagg.api.client import ControllerClient
from homagg.lab import REPO_ROOT


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
    """`python -m homagg.control serve --config CONFIG` listening on `address`, in a session of
    its own. Plaintext (--insecure, a test's controller on loopback) unless `ca` is given:
    then the configuration names its certificate and key, and the client that waits for it
    verifies it against `ca` and sends the operator `token`. kill() is SIGKILL by PID."""

    def __init__(
        self,
        config: Path,
        address: str,
        log: Path,
        *extra_args: str,
        ca: Path | None = None,
        token: str | None = None,
    ) -> None:
        self.config, self.address, self.log = config, address, log
        self.extra_args = extra_args
        self.ca, self.token = ca, token
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> ControllerClient:
        """Start it and wait until it serves and every switch is connected; returns a client."""
        self.launch()
        return self.wait_synced(timeout)

    def launch(self) -> int:
        """Start the process (not waiting for it); returns its PID, also its process group."""
        secure = [] if self.ca is not None else ["--insecure"]
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "homagg.control",
                    "serve",
                    "--config",
                    str(self.config),
                    *secure,
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": path},
            )
        return self.proc.pid

    def wait_synced(self, timeout: float = 30.0) -> ControllerClient:
        """A client once the controller serves and every switch is connected; RuntimeError
        with the log's tail if it exits or is not there within `timeout` s."""
        assert self.proc is not None, "launch() first"
        client = ControllerClient(self.address, 2.0, self.ca, self.token, insecure=self.ca is None)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(s.connected for s in client.status().switches):
                    return client
            except Exception:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                client.close()
                what = "exited" if self.proc.poll() is not None else f"not synced in {timeout} s"
                raise RuntimeError(
                    f"the controller did not come up ({what}):\n"
                    + self.log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL of its process group after `grace` s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL its process group (it leads its own session) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
