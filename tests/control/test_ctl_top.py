"""`aggctl top` against a running controller: in a pseudo-terminal it shows a running job
and ends on Ctrl-C (SIGINT) with status 0, the terminal restored and no traceback; --once
--json is one JSON line; an unreachable controller is one line of error."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
from ctl_helpers import HOSTS, join_all, make_config

from homagg.control.cli import main
from homagg.environment import OPERATOR_TOKEN_ENV
from homagg.lab.switch_process import free_port

AGGCTL = (sys.executable, "-m", "homagg.control")
EXIT_BOUND_S = 5.0  # SIGINT to exit, on a loaded machine


@pytest.fixture
def running(refswitch, tmp_path, start_controller):
    ctl = start_controller(
        make_config(refswitch.address, tmp_path, lease=30.0, heartbeat_interval=5.0)
    )
    job = ctl.client.create_job("top-job", 2, "lossless", pool_size=16)
    join_all(ctl.client, job, HOSTS[:2])
    return ctl, job


def _read_until(fd: int, want: bytes, deadline: float) -> bytes:
    """What the terminal showed until `want` appeared (or the deadline passed)."""
    seen = b""
    while want not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
    return seen


def test_top_in_a_terminal_shows_the_job_and_exits_cleanly_on_ctrl_c(running):
    ctl, _ = running
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [*AGGCTL, "--insecure", "--controller", ctl.address, "top", "--interval", "0.3"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "TERM": "xterm"},
    )
    os.close(slave)
    try:
        screen = _read_until(master, b"rates over", time.monotonic() + 20)
        assert b"\x1b[?1049h" in screen and b"top-job" in screen, screen.decode(errors="replace")
        assert b"switch s1  primary  slots 16/4096" in screen
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        code = proc.wait(EXIT_BOUND_S)
        assert time.monotonic() - start < EXIT_BOUND_S
        rest = _read_until(master, b"\x1b[?1049l", time.monotonic() + 1)
        assert code == 0
        assert b"\x1b[?1049l" in rest and b"\x1b[?25h" in rest  # the terminal restored
        assert b"Traceback" not in screen + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)


def test_once_json_is_one_line_per_refresh(running, capsys):
    ctl, job = running
    top = ["top", "--once", "--json", "--interval", "0.2"]
    code = main(["--insecure", "--controller", ctl.address, *top])
    out = capsys.readouterr().out
    assert code == 0 and out.count("\n") == 1
    doc = json.loads(out)
    [sw] = doc["switches"]
    assert sw["name"] == "s1" and sw["connected"] is True
    assert [(j["job_id"], j["name"], j["packets_per_s"]) for j in sw["jobs"]] == [
        (job.job_id, "top-job", 0.0)
    ]
    assert 0.2 <= doc["interval_s"] < 5 and doc["notes"] == []


def test_an_unreachable_controller_is_one_line(capsys):
    address = f"127.0.0.1:{free_port()}"
    code = main(["--insecure", "--timeout", "3", "--controller", address, "top", "--once"])
    err = capsys.readouterr().err
    assert code == 1 and f"aggctl: UNAVAILABLE: no controller answers at {address}" in err
    assert "Traceback" not in err


def test_the_interval_has_a_floor(capsys):
    with pytest.raises(SystemExit) as info:
        main(["top", "--interval", "0.01"])
    assert info.value.code == 2 and "at least 0.2 s" in capsys.readouterr().err


def test_a_tenant_sees_its_own_jobs_and_why_the_rest_is_missing(
    refswitch, tmp_path, start_controller, monkeypatch, capsys
):
    """carol's top shows carol's job, never dave's; what her credential may not read is one
    line each (with tenants' counters allowed, her job's counters instead of that line)."""
    from test_ctl_roles import CAROL, DAVE, ROOT, client, roles_config

    ctl = start_controller(roles_config(refswitch.address, tmp_path), operator_token=ROOT)
    for token, name, hosts in ((CAROL, "carol-job", HOSTS[:2]), (DAVE, "dave-job", HOSTS[2:3])):
        with client(ctl, token) as c:
            join_all(c, c.create_job(name, len(hosts), "lossless", pool_size=8), hosts)

    def top(token: str) -> dict:
        monkeypatch.setenv(OPERATOR_TOKEN_ENV, token)
        top = ["top", "--once", "--json", "--interval", "0.2"]
        code = main(["--insecure", "--controller", ctl.address, *top])
        assert code == 0
        return json.loads(capsys.readouterr().out)

    doc = top(CAROL)
    jobs = [j for sw in doc["switches"] for j in sw["jobs"]]
    assert [j["name"] for j in jobs] == ["carol-job"] and "dave-job" not in json.dumps(doc)
    assert any(
        n.startswith("switch state not shown (Status: PERMISSION_DENIED") for n in doc["notes"]
    )
    refused = [n for n in doc["notes"] if n.startswith("jobs shown without counters")]
    assert len(refused) == 1 or jobs[0]["packets"] == 0
    admin = top(ROOT)
    assert {j["name"] for sw in admin["switches"] for j in sw["jobs"]} == {"carol-job", "dave-job"}
    assert admin["notes"] == []
