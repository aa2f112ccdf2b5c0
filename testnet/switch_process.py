"""Start a switch process (BMv2's simple_switch_grpc or the reference switch) on given
ports, wait until its P4Runtime server answers, and stop it by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from testnet.rawsock import disable_offloads, offloads_on

TARGETS = ("refswitch", "bmv2")


def bmv2_available() -> bool:
    """True when simple_switch_grpc is on PATH."""
    return shutil.which("simple_switch_grpc") is not None


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
    if target == "bmv2":
        # BMv2 evaluates its per-packet log calls at its default level (trace) even with no
        # log sink: that halves its packet rate (docs/performance.md). Warn keeps them out.
        return [
            "simple_switch_grpc",
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
    switch opens them, and fail if one stays on.

    BMv2 captures each port with libpcap in immediate mode, whose ring (2 MiB, BMv2 sets no
    size) is cut into frames sized for the largest packet the interface can hand it: MTU +
    18 bytes with offloads off (about 1,300 frames), 64 KiB with TSO/GSO/GRO on (31 frames).
    A veth has TSO and GSO on by default, so a burst of more than ~31 frames on one port
    was lost in the kernel, before BMv2 saw it and before any counter (docs/bmv2.md).
    """
    for iface in ports.values():
        disable_offloads(iface)
        still_on = offloads_on(iface)
        if still_on:
            raise RuntimeError(
                f"offloads {', '.join(still_on)} stay on at switch port {iface}: the switch "
                "would lose bursts of more than ~31 frames there; turn them off "
                f"(ethtool -K {iface} tso off gso off gro off lro off) and start it again"
            )


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
        prepare_ports(ports)
        # Kept open while the switch runs (it is the child's stdout); stop() closes it.
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            switch_command(target, ports, self.grpc_port, device_id),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
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
