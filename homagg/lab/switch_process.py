"""Start a switch process (BMv2's simple_switch_grpc or the reference switch) on given
ports, wait until its P4Runtime server answers, and stop it by PID.

The switch runs in a network namespace of its own, which holds its data ports and nothing
else (no address on them, no route): BMv2's Thrift server (`--thrift-port`, table writes
without any credential) binds every interface and cannot be told otherwise, so it must be
where no packet from the data network or any other can reach it. The controller reaches
P4Runtime through a Unix socket (`unix:PATH`, in a directory only root enters), which
crosses namespaces and takes no TCP port at all (docs/controller.md, Security).

Targets: "refswitch", "ebpf" (the program in the kernel, docs/ebpf.md), "bmv2"
(simple_switch_grpc on PATH) and "bmv2-opt": a second BMv2
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
import tempfile
import time
from pathlib import Path

from homagg.environment import BMV2_OPT_ENV
from homagg.lab.namespace import in_namespace, netns_path
from homagg.lab.rawsock import turn_offloads_off
from homagg.wire.constants import NUM_SLOTS

TARGETS = ("refswitch", "bmv2", "bmv2-opt", "ebpf")
BMV2_TARGETS = ("bmv2", "bmv2-opt")
THRIFT_PORT = 9090  # BMv2's Thrift server, on every interface of the switch's own namespace
SOCKET_DIR = Path(tempfile.gettempdir()) / "homagg-p4runtime"  # the switches' P4Runtime sockets


def p4runtime_socket(name: str) -> str:
    """The P4Runtime address of switch `name`: `unix:` a socket in SOCKET_DIR, which only
    its owner (root) may enter, so no other local user reaches P4Runtime either."""
    SOCKET_DIR.mkdir(mode=0o700, exist_ok=True)
    SOCKET_DIR.chmod(0o700)
    return f"unix:{SOCKET_DIR / f'{name}.sock'}"


# BMv2's capture ring holds about 1,300 frames per port with offloads off (docs/bmv2.md): a
# pool of 1024 chunks in flight per rank leaves room for resends, probes and ARP.
BMV2_MAX_POOL_SIZE = 1024


def max_pool_size(target: str) -> int:
    """The controller's `max_pool_size` for a switch of this target: how many chunks a rank
    may have in flight, which reach its port back to back (the reference switch reads its
    ports into a socket buffer per port that the kernel counts drops of: no bound)."""
    return BMV2_MAX_POOL_SIZE if target in BMV2_TARGETS else NUM_SLOTS


AUTO_TARGET = "auto"  # not a target: a command line's choice of resolve_target()
PRESENT_TARGETS = "present"  # not a target: a benchmark's choice of present_targets()


def bmv2_available() -> bool:
    """True when simple_switch_grpc is on PATH."""
    return shutil.which("simple_switch_grpc") is not None


def ebpf_problem() -> str:
    """Why the eBPF target cannot run here ("" when it can): clang or libbpf-dev missing,
    or the kernel refusing the program."""
    from homagg.ebpf.build import build_problem  # libbpf is loaded only when asked
    from homagg.ebpf.libbpf import kernel_problem

    return build_problem() or kernel_problem()


def ebpf_available() -> bool:
    """True when the eBPF target can be compiled and loaded here."""
    return not ebpf_problem()


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
    if target == "ebpf":
        return ebpf_problem()
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
    the eBPF target where the kernel allows it, else the reference switch."""
    if target != AUTO_TARGET:
        return target
    if bmv2_available():
        return "bmv2"
    return "ebpf" if ebpf_available() else "refswitch"


def compared_targets() -> list[str]:
    """The targets a benchmark compares when none are named: the reference switch, BMv2
    when installed (bmv2-opt only when named: it is BMv2 built another way), and the eBPF
    target where the kernel allows it."""
    return (
        ["refswitch"]
        + (["bmv2"] if bmv2_available() else [])
        + (["ebpf"] if ebpf_available() else [])
    )


def present_targets() -> list[str]:
    """What a benchmark's training rows run on when asked for `present` (make bench): the
    default target (resolve_target) and, beside it, the eBPF target where the kernel
    allows it."""
    first = resolve_target(AUTO_TARGET)
    return [first] + (["ebpf"] if first != "ebpf" and ebpf_available() else [])


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
    address: str,
    device_id: int = 0,
    log_level: str | None = None,
    metrics_port: int | None = None,
) -> list[str]:
    """The command line that starts `target` with the given PORT -> interface map and its
    P4Runtime server on `address` (host:port or unix:PATH); the log level defaults to info
    (reference switch) or warn (BMv2); `metrics_port`: the switch's Prometheus metrics on
    that port of its namespace's loopback (the reference and eBPF switches only)."""
    ifaces = [arg for port, iface in sorted(ports.items()) for arg in ("-i", f"{port}@{iface}")]
    addr = address
    if target in ("refswitch", "ebpf"):
        metrics = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
        return [
            sys.executable,
            "-m",
            "homagg.refswitch" if target == "refswitch" else "homagg.ebpf",
            *ifaces,
            "--device-id",
            str(device_id),
            "--grpc-server-addr",
            addr,
            "--log-level",
            log_level or "info",
            *metrics,
        ]
    if metrics_port is not None:
        raise ValueError(f"{target} serves no metrics of its own (refswitch and ebpf do)")
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
            "--thrift-port",  # no way to bind it to one address: the namespace confines it
            str(THRIFT_PORT),
            "--",
            "--grpc-server-addr",
            addr,
        ]
    raise ValueError(f"unknown switch target {target!r}; expected one of {TARGETS}")


def prepare_ports(ports: dict[int, str]) -> None:
    """Turn segmentation and receive offloads off on the switch's own interfaces before the
    switch opens them, and fail if one stays on (homagg/lab/rawsock.py:turn_offloads_off:
    with them on, BMv2's capture ring holds ~31 frames per port instead of ~1,300)."""
    turn_offloads_off(list(ports.values()))


class SwitchProcess:
    """A running switch in network namespace `netns` (a name, or /proc/PID/ns/net), which
    holds its ports (made ready by prepare_ports() there) and nothing else reachable, with
    P4Runtime on the Unix socket p4runtime_socket(name) (`address`); stop() ends it
    (SIGTERM, then SIGKILL) by its PID only. A new one with the same name (a restart) takes
    the same address."""

    def __init__(
        self,
        target: str,
        ports: dict[int, str],
        log_path: Path,
        netns: str,
        name: str,
        device_id: int = 0,
        startup_timeout: float = 20.0,
        metrics_port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`env`: variables the switch process gets on top of its usual environment (e.g.
        HOMAGG_CELLS_PER_PKT for a program built for another cells-per-packet setting)."""
        self.target, self.netns = target, netns
        self.address = p4runtime_socket(name)
        self.socket = Path(self.address.removeprefix("unix:"))
        self.log_path = log_path
        problem = target_problem(target)
        if problem:
            raise RuntimeError(f"cannot start switch {target}: {problem}")
        with in_namespace(netns):
            prepare_ports(ports)
        self.socket.unlink(missing_ok=True)  # left by a switch that was killed
        enter = [shutil.which("nsenter") or "nsenter", f"--net={netns_path(netns)}", "--"]
        # Kept open while the switch runs (it is the child's stdout); stop() closes it.
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*enter, *switch_command(target, ports, self.address, device_id, None, metrics_port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # nsenter execs the switch: its PID leads the group
            env={**(switch_env(target) or os.environ), **env} if env else switch_env(target),
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
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.settimeout(0.5)
                    probe.connect(str(self.socket))
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
        """Terminate the switch and reap it; its socket goes too (a killed switch leaves it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
        self.socket.unlink(missing_ok=True)
