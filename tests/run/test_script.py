"""`make run SCRIPT=... ARGS=...` without Mininet: the options (the script's own arguments
split as a shell would, make run's model options refused), each rank's command and
environment (the switch run attaches, the gloo run has HOMAGG_ATTACH=0), the bytes a host
sent from /proc, and the summary and plot of a script's runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from homagg.environment import (
    ATTACH_ENV,
    CA_FILE_ENV,
    CODEC_ENV,
    CONTROLLER_ENV,
    OPERATOR_TOKEN_FILE_ENV,
)
from run import options, report
from run.credentials import RunCredentials
from run.names import RunNames
from run.script import (
    Traffic,
    check_script,
    net_dev_tx_bytes,
    script_command,
    script_env,
    script_workdir,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def parse(*argv: str):
    args = options.parser().parse_args(list(argv))
    check_script(args)
    return args


def test_script_and_its_arguments():
    args = parse("--script", str(EXAMPLE), "--script-args", "--steps 40 --save 'my model.pt'")
    assert args.script == EXAMPLE and args.script_argv == ["--steps", "40", "--save", "my model.pt"]
    assert parse().script is None  # make run's own model


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--script", "no/such/train.py"], "no such file"),
        (["--script-args", "--steps 4"], "--script-args needs --script"),
        (["--script", str(EXAMPLE), "--script-args", "'unclosed"], "--script-args"),
        (["--script", str(EXAMPLE), "--steps", "40"], "--steps: make run's own model"),
        (["--script", str(EXAMPLE), "--model", "mlp", "--peers", "gloo-fp16"], "--model, --peers"),
    ],
)
def test_what_a_script_cannot_take_is_refused_with_the_option(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(*argv)


def test_each_rank_runs_the_script_under_torchrun_and_only_the_switch_run_attaches(tmp_path):
    names = RunNames(3)
    args = parse("--script", str(EXAMPLE), "--script-args", "--steps 40", "--codec", "fixed_point")
    cmd = script_command(args, names, 1, 4, 29501)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--master-addr") + 1] == names.host_ip(0)
    assert cmd[cmd.index("--node-rank") + 1] == "1" and cmd[cmd.index("--nnodes") + 1] == "4"
    assert cmd[-3:] == [str(EXAMPLE), "--steps", "40"]
    creds = RunCredentials(*(tmp_path / n for n in ("ca", "cert", "key", "tenant", "admin")))
    rank0 = script_env("switch", args, names, 0, creds)
    assert rank0[CONTROLLER_ENV] == f"{names.controller_ip}:50051"
    assert rank0[CODEC_ENV] == "fixed_point" and rank0[CA_FILE_ENV] == str(tmp_path / "ca")
    assert rank0[OPERATOR_TOKEN_FILE_ENV] == str(tmp_path / "tenant")  # rank 0 creates the job
    assert OPERATOR_TOKEN_FILE_ENV not in script_env("switch", args, names, 1, creds)
    assert script_env("gloo", args, names, 0, creds) == {ATTACH_ENV: "0"}
    assert script_workdir(tmp_path, "gloo") == tmp_path / "gloo" and (tmp_path / "gloo").is_dir()


def test_bytes_sent_come_from_the_hosts_namespace():
    assert net_dev_tx_bytes(os.getpid(), "lo") >= 0
    with pytest.raises(ValueError, match="no interface nosuch0"):
        net_dev_tx_bytes(os.getpid(), "nosuch0")


def test_a_scripts_summary_and_plot(tmp_path):
    switch = Traffic(2.0, [(10.0, [0, 0]), (11.0, [1_000_000, 3_000_000]), (12.0, [2_000_000] * 2)])
    assert switch.bytes_per_host() == 2_000_000
    assert switch.rate() == ([1.0, 2.0], [2_000_000.0, 0.0])
    table = report.script_summary_table({"switch": switch, "gloo": Traffic(1.0, [])})
    assert table.splitlines()[0].split()[:3] == ["RUN", "WALL", "s"]
    assert table.splitlines()[1].split() == ["switch", "2.0", "2.00", "1.000"]
    report.plot_traffic({"switch": switch, "gloo": Traffic(1.0, [])}, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
