"""Start a switch process (BMv2's simple_switch_grpc or the reference switch) on given
ports, wait until its P4Runtime server answers, and stop it by PID.

Targets: "refswitch", "bmv2" (simple_switch_grpc on PATH) and "bmv2-opt": a second BMv2
build installed under its own prefix (`-O3`, logging macros and the event logger off:
docs/bmv2.md), named by the environment variable HOMAGG_BMV2_OPT=<prefix> and run as
<prefix>/bin/simple_switch_grpc with <prefix>/lib first on LD_LIBRARY_PATH, so the same
program runs on both builds side by side."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from aggwire.constants import NUM_SLOTS
from testnet.rawsock import turn_offloads_off

TARGETS = ("refswitch", "bmv2", "bmv2-opt")
BMV2_TARGETS = ("bmv2", "bmv2-opt")
BMV2_OPT_ENV = "HOMAGG_BMV2_OPT"  # the optimized BMv2 build's install prefix (no default)
# BMv2's capture ring holds about 1,300 frames per port with offloads off (docs/bmv2.md): a
# pool of 1024 chunks in flight per rank leaves room for resends, probes and ARP.
BMV2_MAX_POOL_SIZE = 1024


def max_pool_size(target: str) -> int:
    """The controller's `max_pool_size` for a switch of this target: how many chunks a rank
    may have in flight, which reach its port back to back (the reference switch reads its
    ports into a socket buffer per port that the kernel counts drops of: no bound)."""
    return BMV2_MAX_POOL_SIZE if target in BMV2_TARGETS else NUM_SLOTS


AUTO_TARGET = "auto"  # not a target: a command line's choice of resolve_target()


def bmv2_available() -> bool:
    """True when simple_switch_grpc is on PATH."""
    return shutil.which("simple_switch_grpc") is not None


def bmv2_opt_prefix() -> Path | None:
    """The optimized BMv2 build's prefix from HOMAGG_BMV2_OPT, or None when unset."""
    value = os.environ.get(BMV2_OPT_ENV, "")
    return Path(value) if value else None


def target_problem(target: str) -> str:
    """Why `target` cannot be started here ("" when it can)."""
    if target not in TARGETS:
        return f"unknown switch target {target!r}; expected one of {', '.join(TARGETS)}"
    if target == "bmv2" and not bmv2_available():
        return "simple_switch_grpc is not on PATH (docs/bmv2.md)"
    if target == "bmv2-opt":
        prefix = bmv2_opt_prefix()
        if prefix is None:
            return f"bmv2-opt needs {BMV2_OPT_ENV}=<prefix of the optimized build> (docs/bmv2.md)"
        if not os.access(prefix / "bin" / "simple_switch_grpc", os.X_OK):
            return f"{BMV2_OPT_ENV}={prefix}: no executable {prefix}/bin/simple_switch_grpc"
    return ""


def available_targets() -> list[str]:
    """The targets that can be started here, the reference switch first."""
    return [t for t in TARGETS if not target_problem(t)]


def resolve_target(target: str) -> str:
    """`target`, with AUTO_TARGET resolved: BMv2 when simple_switch_grpc is installed, else
    the reference switch."""
    if target != AUTO_TARGET:
        return target
    return "bmv2" if bmv2_available() else "refswitch"


def compared_targets() -> list[str]:
    """The targets a benchmark compares when none are named: the reference switch, and
    BMv2 when installed (bmv2-opt only when named: it is BMv2 built another way)."""
    return ["refswitch"] + (["bmv2"] if bmv2_available() else [])


def switch_env(target: str) -> dict[str, str] | None:
    """The environment of the switch process: bmv2-opt finds its own libraries (the
    default build's, on the system's path, would be loaded otherwise); None: inherited."""
    prefix = bmv2_opt_prefix()
    if target != "bmv2-opt" or prefix is None:
        return None
    libs = [str(prefix / "lib"), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":"))]
    return {**os.environ, "LD_LIBRARY_PATH": ":".join(libs)}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def switch_command(
    target: str,
    ports: dict[int, str],
    grpc_port: int,
    device_id: int = 0,
    log_level: str | None = None,
) -> list[str]:
    """The command line that starts `target` with the given PORT -> interface map; the log
    level defaults to info (reference switch) or warn (BMv2)."""
    ifaces = [arg for port, iface in sorted(ports.items()) for arg in ("-i", f"{port}@{iface}")]
    addr = f"127.0.0.1:{grpc_port}"
    if target == "refswitch":
        return [
            sys.executable,
            "-m",
            "refswitch",
            *ifaces,
            "--device-id",
            str(device_id),
            "--grpc-server-addr",
            addr,
            "--log-level",
            log_level or "info",
        ]
    if target in BMV2_TARGETS:
        binary = "simple_switch_grpc"
        if target == "bmv2-opt":
            prefix = bmv2_opt_prefix()
            if prefix is None:
                raise ValueError(target_problem(target))
            binary = str(prefix / "bin" / "simple_switch_grpc")
        # BMv2 evaluates its per-packet log calls at its default level (trace) even with no
        # log sink: that halves its packet rate (docs/performance.md). Warn keeps them out.
        return [
            binary,
            *ifaces,
            "--device-id",
            str(device_id),
            "--no-p4",
            "--log-console",
            "--log-level",
            log_level or "warn",
            "--thrift-port",
            str(free_port()),
            "--",
            "--grpc-server-addr",
            addr,
        ]
    raise ValueError(f"unknown switch target {target!r}; expected one of {TARGETS}")


def prepare_ports(ports: dict[int, str]) -> None:
    """Turn segmentation and receive offloads off on the switch's own interfaces before the
    switch opens them, and fail if one stays on (testnet/rawsock.py:turn_offloads_off:
    with them on, BMv2's capture ring holds ~31 frames per port instead of ~1,300)."""
    turn_offloads_off(list(ports.values()))


class SwitchProcess:
    """A running switch on ports made ready by prepare_ports(); stop() ends it (SIGTERM,
    then SIGKILL) by its PID only."""

    def __init__(
        self,
        target: str,
        ports: dict[int, str],
        log_path: Path,
        device_id: int = 0,
        startup_timeout: float = 20.0,
        grpc_port: int | None = None,
    ) -> None:
        self.target = target
        self.grpc_port = grpc_port or free_port()
        self.address = f"127.0.0.1:{self.grpc_port}"
        self.log_path = log_path
        problem = target_problem(target)
        if problem:
            raise RuntimeError(f"cannot start switch {target}: {problem}")
        prepare_ports(ports)
        # Kept open while the switch runs (it is the child's stdout); stop() closes it.
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            switch_command(target, ports, self.grpc_port, device_id),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=switch_env(target),
        )
        try:
            self._wait_listening(startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.target} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(
            f"{self.target} did not open P4Runtime within {timeout}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the switch logged."""
        self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the switch and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
