"""Create, enter and remove network namespaces and veth pairs by names we own."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def have_privileges() -> bool:
    """True when this process can create namespaces and veth links (root with iproute2)."""
    return os.geteuid() == 0 and _which("ip") is not None


def _which(cmd: str) -> str | None:
    for d in [*os.environ.get("PATH", "").split(":"), "/usr/sbin", "/sbin"]:
        if d and os.access(os.path.join(d, cmd), os.X_OK):
            return os.path.join(d, cmd)
    return None


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGS` (inside netns when given); raises RuntimeError with ip's message."""
    cmd = [_which("ip") or "ip"] + (["-n", netns] if netns else []) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done


def tc(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `tc ARGS` (inside netns when given); raises RuntimeError with tc's message."""
    cmd = [_which("tc") or "tc"] + (["-n", netns] if netns else []) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done


def sysctl(key: str, value: str, netns: str | None = None) -> None:
    """Write a sysctl, inside netns when given (its /proc/sys is per namespace for net.*)."""
    with in_namespace(netns) if netns else _nullcontext():
        Path("/proc/sys", *key.split(".")).write_text(value)


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield


def netns_path(netns: str) -> str:
    """The file of a network namespace given by name (ip netns) or as a path
    (/proc/PID/ns/net: a Mininet node's)."""
    return netns if netns.startswith("/") else f"/run/netns/{netns}"


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextmanager
def in_namespace(name: str) -> Iterator[None]:
    """Run the body with this thread in network namespace `name` (a name or a path, see
    netns_path; sockets made there stay)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(netns_path(name))
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "cannot return to the original network namespace")
    finally:
        os.close(home)


def tcp_connects(netns: str | None, host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection from network namespace `netns` (a name or a path; None: this
    one) to host:port succeeds within `timeout` seconds: what a host there can reach."""
    with in_namespace(netns) if netns else contextlib.nullcontext():
        sock = socket.socket()
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def add_namespace(name: str) -> None:
    """Create namespace `name` with IPv6 off (no router solicitations on our links)."""
    ip("netns", "add", name)
    sysctl("net.ipv6.conf.all.disable_ipv6", "1", netns=name)
    sysctl("net.ipv6.conf.default.disable_ipv6", "1", netns=name)
    ip("link", "set", "lo", "up", netns=name)


def delete_namespace(name: str) -> None:
    """Remove namespace `name` and the links inside it; missing is fine."""
    ip("netns", "delete", name, check=False)


def add_veth(outside: str, inside: str, netns: str, outside_netns: str | None = None) -> None:
    """A veth pair: `outside` in this namespace, or in `outside_netns` when given (IPv6 off,
    up), `inside` in netns (up)."""
    where = ["netns", outside_netns] if outside_netns else []
    ip("link", "add", outside, *where, "type", "veth", "peer", "name", inside, "netns", netns)
    sysctl(f"net.ipv6.conf.{outside}.disable_ipv6", "1", netns=outside_netns)
    ip("link", "set", outside, "up", netns=outside_netns)
    ip("link", "set", inside, "up", netns=netns)


def delete_link(name: str) -> None:
    """Remove a link of this namespace; missing is fine."""
    ip("link", "delete", name, check=False)


def enter_namespace(name: str) -> None:
    """Move this thread into network namespace `name` for good (a name or a path, see
    netns_path): a child process's main thread, before it makes the sockets and threads
    that should live there (threads it starts later inherit it)."""
    _setns(netns_path(name))
