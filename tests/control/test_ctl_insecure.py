"""--insecure is for loopback: `aggctl serve --insecure` refuses a listen address other hosts
can reach unless --insecure-non-loopback is given too, and then warns; every insecure start
logs an INSECURE line per missing part (docs/controller.md, Security)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from homagg.control.cli import main
from homagg.control.config import is_loopback
from homagg.lab.switch_process import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:0", True),
        ("127.0.0.2:50051", True),
        ("[::1]:0", True),
        ("localhost:50051", True),
        ("unix:/run/homagg/ctl.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:0", False),
        ("10.0.0.100:50051", False),
        ("no-such-host.invalid:50051", False),
    ],
)
def test_is_loopback(listen, loopback):
    assert is_loopback(listen) is loopback


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[controller]\nlisten = "127.0.0.1:0"\ndatabase = "{tmp_path / "c.db"}"\n\n'
        '[[switch]]\nname = "s1"\naddress = "127.0.0.1:1"\nmac = "02:00:00:00:00:fe"\n'
        'service_ip = "10.0.0.254"\n'
    )
    return config


def test_insecure_on_a_non_loopback_address_is_refused(tmp_path, capsys):
    config = _config(tmp_path)
    for listen in ("0.0.0.0:0", "[::]:0"):
        assert main(["serve", "--insecure", "--config", str(config), "--listen", listen]) == 2
        err = capsys.readouterr().err
        assert f"refusing to serve insecurely on {listen}, which is not a loopback" in err
        assert "no TLS certificate" in err and "--insecure-non-loopback" in err
    assert not (tmp_path / "c.db").exists()  # refused before anything started


def _serve_log(tmp_path: Path, *extra: str) -> str:
    """Start `aggctl serve --insecure` until it listens; its log (stderr), then SIGTERM."""
    log = tmp_path / f"serve-{len(list(tmp_path.glob('serve-*')))}.log"
    config = _config(tmp_path)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "homagg.control",
                "serve",
                "--insecure",
                "--config",
                str(config),
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while "controller listening" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return log.read_text()


@pytest.mark.slow
def test_insecure_non_loopback_starts_and_warns(tmp_path):
    port = free_port()
    text = _serve_log(tmp_path, "--listen", f"0.0.0.0:{port}", "--insecure-non-loopback")
    assert f"controller listening on 0.0.0.0:{port}" in text
    assert f"INSECURE: 0.0.0.0:{port} is not a loopback address" in text
    assert "INSECURE: no [[operator]] configured" in text
    assert "INSECURE: the job API on" in text and "is plaintext" in text


@pytest.mark.slow
def test_insecure_on_loopback_logs_what_is_missing(tmp_path):
    text = _serve_log(tmp_path)
    assert "controller listening on 127.0.0.1:" in text
    assert "INSECURE: no [[operator]] configured" in text
    assert "INSECURE: the job API on 127.0.0.1:0 is plaintext" in text
    assert "is not a loopback address" not in text
