"""`python -m homagg.worker`: create, join (--json), bench through the switch, help and errors; the
job token from a file or the environment, never an argument."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from homagg.api import validation
from homagg.environment import CA_FILE_ENV, JOB_TOKEN_ENV, JOB_TOKEN_FILE_ENV
from homagg.lab.controlled import Controlled, free_port_udp
from homagg.lab.namespace import have_privileges
from homagg.worker.cli import main


@pytest.fixture(autouse=True)
def no_secrets_in_env(monkeypatch):
    for name in (JOB_TOKEN_ENV, JOB_TOKEN_FILE_ENV, CA_FILE_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("cli-ctl"), 1, fabric=False)
    yield c
    c.close()


def test_create_then_join_prints_the_assignment(ctl, capsys, tmp_path):
    assert (
        main(
            [
                "create",
                "--insecure",
                "--controller",
                ctl.address,
                "--world-size",
                "1",
                "--pool-size",
                "8",
                "--json",
            ]
        )
        == 0
    )
    job = json.loads(capsys.readouterr().out)
    token_file = tmp_path / "job.token"
    token_file.write_text(job["token"] + "\n")
    assert (
        main(
            [
                "join",
                "--insecure",
                "--controller",
                ctl.address,
                "--job-id",
                str(job["job_id"]),
                "--token-file",
                str(token_file),
                "--rank",
                "0",
                "--ip",
                "127.0.0.1",
                "--udp-port",
                str(free_port_udp()),
                "--switch-port",
                "7",
                "--mac",
                "02:00:00:00:09:01",
                "--json",
            ]
        )
        == 0
    )
    asg = json.loads(capsys.readouterr().out)
    assert asg["job_id"] == job["job_id"] and asg["pool_size"] == 8 and asg["world_size"] == 1


def test_bad_token_exits_1_with_a_message(ctl, capsys, monkeypatch):
    monkeypatch.setenv(JOB_TOKEN_ENV, "-nope")  # a token may begin with '-'
    assert (
        main(
            [
                "join",
                "--insecure",
                "--controller",
                ctl.address,
                "--job-id",
                "1",
                "--rank",
                "0",
                "--ip",
                "127.0.0.1",
                "--switch-port",
                "1",
                "--mac",
                "02:00:00:00:09:01",
            ]
        )
        == 1
    )
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_help_has_an_example_per_command():
    out = subprocess.run(
        [sys.executable, "-m", "homagg.worker", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    for cmd in ("create", "join", "bench"):
        assert f"python -m homagg.worker {cmd}" in out.stdout


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
def test_bench_through_the_switch(tmp_path, capsys):
    c = Controlled(tmp_path, 1, fabric=True)
    try:
        job = c.create(1, pool_size=16)
        token_file = tmp_path / "job.token"
        token_file.write_text(job.token)
        h = c.fabric.hosts[0]
        assert (
            main(
                [
                    "bench",
                    "--insecure",
                    "--controller",
                    c.address,
                    "--job-id",
                    str(job.job_id),
                    "--token-file",
                    str(token_file),
                    "--rank",
                    "0",
                    "--ip",
                    h.ip,
                    "--switch-port",
                    "1",
                    "--mac",
                    h.mac,
                    "--netns",
                    h.namespace,
                    "--codec",
                    "lossless",
                    "--size",
                    "20000",
                    "--density",
                    "0.01",
                    "--rounds",
                    "3",
                    "--json",
                ]
            )
            == 0
        )
    finally:
        c.close()
    out = json.loads(capsys.readouterr().out)
    assert len(out["rounds"]) == 3
    assert 0 < out["summary"]["wire_vs_dense"] < 0.5  # 1% dense: far fewer bytes than dense
    assert all(r["wire_bytes"] > 0 for r in out["rounds"])


JOIN = ["join", "--rank", "0", "--ip", "127.0.0.1", "--switch-port", "1"]
JOIN += ["--mac", "02:00:00:00:09:01"]


def test_a_token_beginning_with_a_dash_joins(ctl, capsys, tmp_path, monkeypatch):
    """A token that begins with '-' (controllers before the hgt_ prefix made one in 64) is a
    value like any other when it comes from a file or the environment."""
    monkeypatch.setattr(validation, "TOKEN_PREFIX", "-")
    for how in ("file", "env"):
        made = ctl.create(1, pool_size=4)
        assert made.token.startswith("-")
        if how == "file":
            path = tmp_path / "job.token"
            path.write_text(made.token + "\n")
            argv = ["--token-file", str(path)]
        else:
            monkeypatch.setenv(JOB_TOKEN_ENV, made.token)
            argv = []
        base = [*JOIN, "--insecure", "--controller", ctl.address, "--job-id", str(made.job_id)]
        assert main([*base, *argv, "--udp-port", str(free_port_udp()), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["job_id"] == made.job_id


def test_secrets_and_tls_are_refused_with_what_to_give(ctl, capsys, tmp_path, monkeypatch):
    base = [*JOIN, "--controller", ctl.address, "--job-id", "1"]
    assert main([*base, "--insecure"]) == 2
    assert "no job token: give --token-file" in capsys.readouterr().err
    monkeypatch.setenv(JOB_TOKEN_ENV, "-x")
    assert main(base) == 2
    assert "--ca-file" in capsys.readouterr().err
    assert main([*base, "--ca-file", str(tmp_path / "missing.crt")]) == 1
    assert "cannot read the CA file" in capsys.readouterr().err
    (tmp_path / "empty").write_text("")
    assert main([*base, "--insecure", "--token-file", str(tmp_path / "empty")]) == 2
    assert "is empty" in capsys.readouterr().err


def test_no_token_option_on_the_command_line(capsys):
    with pytest.raises(SystemExit):
        main([*JOIN, "--insecure", "--job-id", "1", "--token", "secret"])
    assert "unrecognized arguments: --token" in capsys.readouterr().err


def test_create_writes_the_token_to_a_private_file(ctl, capsys, tmp_path):
    path = tmp_path / "job.token"
    argv = ["create", "--insecure", "--controller", ctl.address, "--world-size", "1"]
    assert main([*argv, "--pool-size", "4", "--token-file", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "token" not in out and path.stat().st_mode & 0o777 == 0o600
    assert len(path.read_text().strip()) >= 16
