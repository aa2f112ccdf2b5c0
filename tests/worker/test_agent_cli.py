"""`python -m worker`: create, join (--json), bench through the switch, help and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from agent_fabric import Controlled, free_port_udp

from testnet.namespace import have_privileges
from worker.cli import main


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    c = Controlled(tmp_path_factory.mktemp("cli-ctl"), 1, fabric=False)
    yield c
    c.close()


def test_create_then_join_prints_the_assignment(ctl, capsys):
    assert (
        main(
            [
                "create",
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
    assert (
        main(
            [
                "join",
                "--controller",
                ctl.address,
                "--job-id",
                str(job["job_id"]),
                "--token",
                job["token"],
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


def test_bad_token_exits_1_with_a_message(ctl, capsys):
    assert (
        main(
            [
                "join",
                "--controller",
                ctl.address,
                "--job-id",
                "1",
                "--token",
                "nope",
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
        [sys.executable, "-m", "worker", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0
    for cmd in ("create", "join", "bench"):
        assert f"python -m worker {cmd}" in out.stdout


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
def test_bench_through_the_switch(tmp_path, capsys):
    c = Controlled(tmp_path, 1, fabric=True)
    try:
        job = c.create(1, pool_size=16)
        h = c.fabric.hosts[0]
        assert (
            main(
                [
                    "bench",
                    "--controller",
                    c.address,
                    "--job-id",
                    str(job.job_id),
                    "--token",
                    job.token,
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
