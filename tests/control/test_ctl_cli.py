"""aggctl against a running controller: every command with --json (what scripts rely on) and as
a table, its errors, and --help with an example for each command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ctl_helpers import HOSTS, join_all, make_config

from homagg.api import jobs_pb2
from homagg.control.cli import COMMANDS, main
from homagg.control.text_table import render_jobs, render_status
from homagg.lab.switch_process import free_port


@pytest.fixture
def running(refswitch, tmp_path, start_controller):
    ctl = start_controller(
        make_config(refswitch.address, tmp_path, lease=30.0, heartbeat_interval=5.0)
    )
    job = ctl.client.create_job("cli-job", 2, "dense", pool_size=32)
    join_all(ctl.client, job, HOSTS[:2])
    return ctl, job


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """aggctl against the tests' plaintext controller (the secured one: test_ctl_security.py)."""
    code = main(["--insecure", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, ctl, *argv: str):
    code, out, err = run(capsys, "--controller", ctl.address, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_output(running, capsys):
    ctl, job = running
    status = run_json(capsys, ctl, "status")
    assert status["active_jobs"] == 1 and status["listen"] == ctl.address
    [sw] = status["switches"]
    assert sw["name"] == "s1" and sw["connected"] is True and sw["slots_used"] == 32
    [j] = run_json(capsys, ctl, "jobs")["jobs"]
    assert (j["job_id"], j["name"], j["state"], j["joined"]) == (job.job_id, "cli-job", "ready", 2)
    assert [w["rank"] for w in j["workers"]] == [0, 1]
    ranges = run_json(capsys, ctl, "pools")["ranges"]
    assert [(r["base"], r["size"], r["job_id"]) for r in ranges] == [
        (0, 32, job.job_id),
        (32, 4064, 0),
    ]
    [counters] = run_json(capsys, ctl, "counters", "--job", str(job.job_id))["switches"]
    assert counters["jobs"][0]["job_id"] == job.job_id and len(counters["jobs"][0]["workers"]) == 2
    assert counters["jobs"][0]["packets"] == 0  # a number, not proto3 JSON's string
    assert {d["name"] for d in counters["ingress_drops"]} >= {"UNKNOWN_JOB", "WRONG_PORT"}
    released = run_json(capsys, ctl, "release", str(job.job_id))
    assert released["state"] == "ended" and released["end_reason"] == "released by the operator"
    assert run_json(capsys, ctl, "jobs")["jobs"] == []
    assert run_json(capsys, ctl, "jobs", "--all")["jobs"][0]["job_id"] == job.job_id


def test_tables(running, capsys):
    ctl, job = running
    code, out, _ = run(capsys, "--controller", ctl.address, "status")
    assert code == 0 and "SWITCH" in out and "CONNECTED" in out and "32/4096" in out
    code, out, _ = run(
        capsys, "jobs", "--ranks", "--controller", ctl.address
    )  # options after the command too
    assert (
        code == 0 and "cli-job" in out and "ready" in out and "0..31" in out and "LEASE LEFT" in out
    )
    code, out, _ = run(capsys, "--controller", ctl.address, "pools")
    assert (
        code == 0 and f"job {job.job_id} (cli-job)" in out and "32..4095" in out and "free" in out
    )
    code, out, _ = run(capsys, "--controller", ctl.address, "counters", "--zero")
    assert code == 0 and "UNKNOWN_JOB" in out and "CONTRIBUTION" in out and "cli-job" in out
    code, out, _ = run(capsys, "--controller", ctl.address, "release", str(job.job_id))
    assert code == 0 and f"released job {job.job_id}" in out and "32 slots freed on s1" in out


def test_jobs_table_names_the_pool_size_and_shows_no_slots_before_placement():
    placed = jobs_pb2.JobInfo(
        job_id=1,
        name="a",
        state="ready",
        switch="s1",
        world_size=2,
        joined=2,
        codec="dense",
        pool_base=64,
        pool_size=16,
    )
    unplaced = jobs_pb2.JobInfo(
        job_id=2, name="b", state="waiting", world_size=2, codec="dense", pool_size=8
    )
    header, row_a, row_b = render_jobs([placed, unplaced], ranks=False).splitlines()
    assert header.split()[6:9] == ["SLOTS", "POOL", "SIZE"]
    assert row_a.split()[6:8] == ["64..79", "16"] and row_b.split()[6:8] == ["-", "8"]


def _columns(header: str, row: str) -> dict[str, str]:
    """A rendered row cut at the header's column starts (names are single words or 'X Y')."""
    names = ["SWITCH", "ADDRESS", "DEVICE", "CONNECTED", "ROLE", "SLOTS USED", "JOBS", "HOSTS"]
    names += ["SERVICE IP", "CONNECTS", "PUSHES", "LAST ERROR"]
    starts = [header.index(n) for n in names]
    ends: list[int | None] = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def test_status_table_shows_each_switch_role():
    """ROLE: primary, backup (the primary's election id is in LAST ERROR) or none (no
    session)."""
    common = dict(device_id=0, slots_total=4096, hosts=2, service_ip="10.0.0.254")
    st = jobs_pb2.StatusResponse(
        version="0.1.0",
        uptime_s=65,
        database="c.db",
        listen="127.0.0.1:50051",
        active_jobs=1,
        switches=[
            jobs_pb2.SwitchStatus(
                name="s1", address="127.0.0.1:9559", connected=True, role="primary", jobs=1,
                slots_used=128, connects=1, pipeline_pushes=1, **common,
            ),
            jobs_pb2.SwitchStatus(
                name="s2", address="127.0.0.1:9560", connected=False,
                role="backup (election id 20 is primary)", connects=1,
                last_error="the controller is not primary (a client with election id 20 is, "
                "the controller has 10)", **common,
            ),
            jobs_pb2.SwitchStatus(
                name="s3", address="127.0.0.1:9561", connected=False, role="none",
                last_error="switch s3 unreachable within 1.0 s", **common,
            ),
        ],
    )  # fmt: skip
    head, table = render_status(st).split("\n\n")
    assert head.startswith("controller 127.0.0.1:50051  version 0.1.0  up 1m05s")
    header, *rows = table.splitlines()
    cells = [_columns(header, row) for row in rows]
    assert [(c["SWITCH"], c["CONNECTED"], c["ROLE"]) for c in cells] == [
        ("s1", "yes", "primary"),
        ("s2", "NO", "backup"),
        ("s3", "NO", "none"),
    ]
    assert cells[0]["SLOTS USED"] == "128/4096" and cells[0]["LAST ERROR"] == "-"
    assert "election id 20" in cells[1]["LAST ERROR"]


def test_status_table_of_a_live_controller_says_primary(running, capsys):
    ctl, _ = running
    code, out, _ = run(capsys, "--controller", ctl.address, "status")
    header, row = out.strip().splitlines()[-2:]
    assert code == 0 and _columns(header, row)["ROLE"] == "primary"


def test_errors_are_one_line(running, capsys):
    ctl, _ = running
    code, out, err = run(capsys, "--controller", ctl.address, "release", "999")
    assert code == 1 and out == "" and err.strip() == "aggctl: NOT_FOUND: no job 999"
    code, _, err = run(
        capsys, "--controller", f"127.0.0.1:{free_port()}", "--timeout", "0.5", "status"
    )
    assert code == 1 and "UNAVAILABLE" in err and "no controller answers" in err


def test_serve_refuses_a_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[controller]\nlease = 1.0\nheartbeat_interval = 1.0\n[[switch]]\nname = "s1"\n')
    assert main(["serve", "--config", str(bad)]) == 2
    assert "missing key 'address'" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_explains_each_command_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Example" in out and f"aggctl {command}" in out.replace(
        "aggctl --controller 10.0.0.5:50051", "aggctl"
    )


def test_installed_script_and_module(refswitch):
    script = Path(sys.executable).with_name("aggctl")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "serve" in out.stdout and "counters" in out.stdout
    shell = subprocess.run(
        [sys.executable, "-m", "homagg.control", "shell", "--switch", refswitch.address],
        input="print('PUSHED', push())\nprint('ROUTES', len(entries(p4names.IPV4_LPM)))\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.returncode == 0, shell.stderr
    assert (
        "PUSHED None" in shell.stdout
        and "ROUTES 0" in shell.stdout
        and "P4Runtime shell" in shell.stderr
    )


def test_job_commands(refswitch, tmp_path, start_controller, capsys):
    ctl = start_controller(make_config(refswitch.address, tmp_path))
    token_file = tmp_path / "job.token"
    made = run_json(
        capsys, ctl, "job", "create", "ops", "--world-size", "2", "--pool-size", "8",
        "--codec", "fixed_point", "--token-file", str(token_file),
    )  # fmt: skip
    assert made["token"] == "" and made["pool_size"] == 8
    token = token_file.read_text().strip()
    assert len(token) >= 32 and token_file.stat().st_mode & 0o777 == 0o600
    h = HOSTS[0]
    ctl.client.join(made["job_id"], token, 0, h["mac"], h["ip"], 41000)  # the token works
    shown = run_json(capsys, ctl, "job", "show", str(made["job_id"]))
    assert (shown["name"], shown["codec"], shown["joined"]) == ("ops", "fixed_point", 1)
    code, out, _ = run(capsys, "--controller", ctl.address, "job", "show", str(made["job_id"]))
    assert code == 0 and "ops" in out and h["ip"] in out  # the table lists the ranks
    [listed] = run_json(capsys, ctl, "job", "list")["jobs"]
    assert listed["job_id"] == made["job_id"]
    code, out, _ = run(capsys, "--controller", ctl.address, "job", "list", "--ranks")
    [head, row, *ranks] = out.splitlines()
    assert code == 0 and head.split()[:5] == ["JOB", "NAME", "STATE", "SWITCH", "RANKS"]
    want = [str(made["job_id"]), "ops", "waiting", "s1", "1/2", "fixed_point", "0..7", "8"]
    assert row.split()[:8] == want
    assert h["ip"] in "\n".join(ranks)
    code, out, _ = run(
        capsys, "--controller", ctl.address, "job", "create", "t", "--world-size", "1"
    )
    assert code == 0 and "token " in out
    other = int(out.split("created job ")[1].split()[0])
    code, out, _ = run(capsys, "--controller", ctl.address, "job", "release", str(made["job_id"]))
    assert code == 0 and out.strip() == (
        f"released job {made['job_id']} (ops): entries removed, 8 slots freed on s1"
    )
    code, out, _ = run(capsys, "--controller", ctl.address, "job", "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == [str(other)]
    code, out, _ = run(capsys, "--controller", ctl.address, "job", "list", "--all")
    [row] = [line for line in out.splitlines() if line.split()[0] == str(made["job_id"])]
    assert " ended " in row and row.endswith("released by the operator")
    code, _, err = run(capsys, "--controller", ctl.address, "job", "release", str(made["job_id"]))
    assert code == 1 and err.strip() == (
        f"aggctl: FAILED_PRECONDITION: job {made['job_id']} has already ended: released by "
        "the operator"
    )
    released = run_json(capsys, ctl, "job", "release", str(other))
    assert released["state"] == "ended"
    code, out, err = run(capsys, "--controller", ctl.address, "job", "show", "999")
    assert code == 1 and out == "" and err.strip() == "aggctl: NOT_FOUND: no job 999"
    code, _, err = run(
        capsys, "--controller", ctl.address, "job", "create", "x", "--world-size", "99"
    )
    assert code == 1 and err.startswith("aggctl: INVALID_ARGUMENT")
