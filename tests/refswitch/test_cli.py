"""The refswitch command: help, bad arguments, clean shutdown on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import free_port
from homagg.refswitch.cli import build_parser, is_wildcard


def run(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "homagg.refswitch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_explains_the_flags():
    out = run("--help").stdout
    assert "PORT@IFACE" in out and "--grpc-server-addr" in out and "example:" in out


def test_p4runtime_binds_loopback_unless_told():
    assert build_parser().parse_args([]).grpc_server_addr == "127.0.0.1:9559"
    assert is_wildcard("0.0.0.0:9559") and is_wildcard("[::]:9559") and is_wildcard(":9559")
    assert not is_wildcard("127.0.0.1:9559") and not is_wildcard("10.0.0.1:1")


def test_bad_interface_spec_is_a_clear_error():
    done = run("-i", "veth0")
    assert done.returncode == 2 and "expected PORT@IFACE" in done.stderr


@pytest.mark.skipif(not have_privileges(), reason="opening raw sockets needs root")
def test_missing_interface_is_a_clear_error():
    done = run("-i", "1@hg-no-such-if", "--grpc-server-addr", f"127.0.0.1:{free_port()}")
    assert done.returncode == 1 and "cannot open the switch ports" in done.stderr


def test_sigterm_stops_cleanly():
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "homagg.refswitch",
            "--no-p4",
            "--",
            "--grpc-server-addr",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [proc.stderr.readline() for _ in range(2)]
        assert any(f"P4Runtime on port {port}" in line for line in lines), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
