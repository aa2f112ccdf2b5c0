"""The pieces of `make run` that need neither root nor Mininet: the topology file, the
report (table, bound, plot), the run state that `make stop` reads."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

from homagg.lab.addresses import CONTROLLER_INDEX, MAX_HOSTS_WITH_CONTROLLER, host_switch_port
from run import report
from run.credentials import make_run_credentials
from run.names import MAX_RUNS, RunNames
from run.state import (
    RunState,
    alive,
    cleanup,
    recorded_runs,
    remove_credentials,
    stopped_runs_with_credentials,
)

ROOT = Path(__file__).resolve().parents[2]


def test_topology_file_and_overrides():
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from run.net import Topology

    t = Topology.load(ROOT / "mininet" / "star4.toml")
    assert (t.hosts, t.bw_mbit) == (4, 100.0)
    assert Topology.load(ROOT / "mininet" / "star4.toml", hosts=2, bw_mbit=None).hosts == 2


def _steps(n: int) -> list[dict]:
    return [
        {
            "step": i,
            "loss": 0.7 - 0.01 * i,
            "seconds": 0.1,
            "tx_bytes": 100.0,
            "dense_bytes": 1000,
            "retransmissions": 1,
            "fallback_buckets": 0,
            "grad_max": 0.01,
            "param_max": 1.0,
        }
        for i in range(n)
    ]


def test_summary_bound_and_plot(tmp_path):
    table = report.summary_table({"switch": _steps(5), "gloo": _steps(5)})
    assert "0.10x" in table and table.splitlines()[1].startswith("switch")
    assert "CPU ms/STEP" in table.splitlines()[0] and " - " in table.splitlines()[1]
    # every rank's CPU a step, summed (the records' cpu_seconds): the median after step 0
    cpu = [{**s, "cpu_seconds": c} for s, c in zip(_steps(4), (9.0, 0.03, 0.05, 0.04))]
    assert "  40.0  " in report.summary_table({"switch": cpu}).splitlines()[1]
    # W = 2: P = 30; E(0.01) = -6: lr * (2^-37 + 2^-30) + 2^-23 (param 1.0 -> E = 1) per step
    one = 0.5 * (2.0**-37 + 2.0**-30) + 2.0**-23
    assert report.fixed_point_bound(_steps(3), 2, 0.5) == pytest.approx(3 * one)
    report.plot({"a": _steps(5)}, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    torch.save({"w": torch.ones(3)}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(3) + 1e-6}, tmp_path / "b.pt")
    assert report.compare(tmp_path / "a.pt", tmp_path / "b.pt") == pytest.approx(1e-6, rel=0.2)
    # a buffer both hold -inf in (the LM's causal mask) is equal, not NaN; a NaN is not
    mask = torch.tensor([0.0, -math.inf])
    torch.save({"w": torch.ones(3), "mask": mask}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(3) + 1e-6, "mask": mask}, tmp_path / "b.pt")
    assert report.compare(tmp_path / "a.pt", tmp_path / "b.pt") == pytest.approx(1e-6, rel=0.2)
    torch.save({"w": torch.ones(3), "mask": torch.tensor([0.0, math.nan])}, tmp_path / "b.pt")
    assert math.isnan(report.compare(tmp_path / "a.pt", tmp_path / "b.pt"))


def test_the_verdict_names_the_bound_first_order_for_short_runs():
    ok, text = report.verdict(3e-7, 7.6e-6, 120)
    assert ok and text.endswith("AGREE within the bound")
    assert "first-order fixed-point bound 7.6e-06 (for short runs: 120 steps here" in text
    ok, text = report.verdict(1e-5, 7.6e-6, 120)
    assert not ok and "first-order" in text and text.endswith("DIFFER beyond the bound")


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """Run directories under tmp_path, and no interface of ours on this machine."""
    monkeypatch.setattr("run.names.STATE_DIR", tmp_path)
    monkeypatch.setattr("run.state.STATE_DIR", tmp_path)
    monkeypatch.setattr("run.state.our_links", lambda names: [])
    return tmp_path


def test_two_runs_names_addresses_and_directories_never_collide():
    runs = [RunNames(n) for n in (1, 2, 12, 21, 121, MAX_RUNS)]
    for a, b in itertools.combinations(runs, 2):
        mine = {a.switch, a.controller_host, a.controller_ip, a.service_ip, a.directory}
        mine |= {a.host(i) for i in range(MAX_HOSTS_WITH_CONTROLLER)} | {
            a.host_ip(i) for i in range(4)
        }
        theirs = {b.switch, b.controller_host, b.controller_ip, b.service_ip, b.directory}
        theirs |= {b.host(i) for i in range(MAX_HOSTS_WITH_CONTROLLER)} | {
            b.host_ip(i) for i in range(4)
        }
        assert not mine & theirs
        # make stop deletes interfaces by prefix: one run's prefixes never match the other's
        for link in (
            f"{b.switch}-eth{host_switch_port(CONTROLLER_INDEX)}",
            f"{b.controller_host}-eth0",
        ):
            assert not link.startswith(a.link_prefixes)
    last = RunNames(MAX_RUNS)
    assert (
        len(f"{last.host(MAX_HOSTS_WITH_CONTROLLER - 1)}-eth0") <= 15
    )  # Linux's interface name limit
    assert len(f"{last.switch}-eth{host_switch_port(CONTROLLER_INDEX)}") <= 15
    for bad in (0, MAX_RUNS + 1):
        with pytest.raises(ValueError, match="run number"):
            RunNames(bad)
    with pytest.raises(ValueError, match="host index"):
        last.host(MAX_HOSTS_WITH_CONTROLLER)


def test_runs_claim_distinct_numbers_and_skip_an_interrupted_one(state_dir):
    first, second = RunState.claim(), RunState.claim()
    assert (first.names.number, second.names.number) == (1, 2)
    assert first.path != second.path and first.path.parent != second.path.parent
    with pytest.raises(FileExistsError):
        RunState(RunNames(2))  # a number is owned by one run only
    first.clear()
    assert not first.names.directory.exists()  # nothing in it: removed
    assert RunState.claim().names.number == 1  # freed by a clean end that left no output
    assert [r.number for r in recorded_runs(os.geteuid())] == [1, 2]
    assert recorded_runs(os.geteuid() + 1) == []


def test_a_number_whose_output_is_there_is_never_reused(state_dir):
    run = RunState.claim()
    (run.names.directory / "out").mkdir()
    (run.names.directory / "out" / "make-run.png").write_bytes(b"plot")
    run.clear()
    assert RunState.claim().names.number == 2  # run 1's plot stays run 1's


def test_a_run_removes_its_credentials_when_it_ends_and_make_stop_those_of_stopped_runs(
    state_dir,
):
    run = RunState.claim()
    make_run_credentials(run.names.credentials_dir, run.names.controller_ip)
    (run.names.directory / "out").mkdir()
    run.clear()
    assert not run.names.credentials_dir.exists() and (run.names.directory / "out").exists()
    # interrupted: its owner died, its credentials are there; make stop removes them
    dead = RunState(RunNames(7))
    make_run_credentials(dead.names.credentials_dir, dead.names.controller_ip)
    data = json.loads(dead.path.read_text())
    data["owner"] = [2**22 + 1]
    dead.path.write_text(json.dumps(data))
    assert str(dead.names.credentials_dir) in cleanup(dead.names)
    assert not dead.names.directory.exists()
    # left by an earlier version without a state file: make stop (every run) finds them
    old = RunNames(9)
    make_run_credentials(old.credentials_dir, old.controller_ip)
    assert stopped_runs_with_credentials() == [old]
    assert remove_credentials(old) == [str(old.credentials_dir)] and not old.directory.exists()


def test_stop_refuses_while_the_run_lives_and_forgets_a_dead_one(state_dir):
    state = RunState(RunNames(3))
    state.add("pgids", 2**22 + 12345)  # a PID that does not exist
    with pytest.raises(RuntimeError, match=r"run 3 .* still running.*make stop RUN=3"):
        cleanup(state.names)  # its owner (this process) is alive
    data = json.loads(state.path.read_text())
    data["owner"] = [2**22 + 1]
    state.path.write_text(json.dumps(data))
    assert cleanup(state.names) == [] and not state.path.exists()
    assert alive(os.getpid()) and not alive(2**22 + 1)


def test_stop_ends_a_live_run_by_its_pid_and_leaves_other_runs_alone(state_dir):
    runs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        states = [RunState(RunNames(n)) for n in (4, 5)]
        for st, proc in zip(states, runs):
            data = json.loads(st.path.read_text())
            data["owner"] = [proc.pid]
            st.path.write_text(json.dumps(data))
        removed = cleanup(states[0].names, stop_live=True, wait=10)
        assert removed == [f"run 4 (pid {runs[0].pid}) stopped"]
        assert runs[0].wait(5) == -signal.SIGTERM and not states[0].path.exists()
        assert runs[1].poll() is None and states[1].path.exists()
    finally:
        for proc in runs:
            proc.kill()
            proc.wait()


def test_grad_max_of_dense_and_sparse_gradients():
    from run.train import _grad_max

    dense = torch.tensor([[0.5, -3.0], [1.0, 2.0]])
    sparse = torch.sparse_coo_tensor([[1, 1]], torch.tensor([[-4.0, 1.0], [0.5, 0.0]]), (3, 2))
    assert _grad_max(dense) == 3.0
    assert _grad_max(sparse) == 3.5  # the duplicate row 1 sums: |-4 + 0.5|
    assert _grad_max(torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), [], (3,))) == 0.0


def test_rank_commands_name_the_master_and_only_the_switch_run_has_the_controller(tmp_path):
    from run.control import controller_address
    from run.jobs import rank_command
    from run.options import parser

    args = parser().parse_args(["--hosts", "2", "--pool-size", "16", "--out", str(tmp_path)])
    args.lr = 0.5
    names = RunNames(3)
    cmd = rank_command("switch", args, names, 1, 2, 29500, "hg3h2-eth0")
    assert cmd[cmd.index("--node-rank") + 1] == "1" and cmd[cmd.index("--nnodes") + 1] == "2"
    assert cmd[cmd.index("--master-addr") + 1] == names.host_ip(0)
    at = cmd.index("run.train")
    opts = dict(zip(cmd[at + 1 :: 2], cmd[at + 2 :: 2], strict=True))
    assert opts["--mode"] == "switch" and opts["--iface"] == "hg3h2-eth0"
    assert opts["--controller"] == controller_address(names) and opts["--pool-size"] == "16"
    assert (opts["--lr"], opts["--out"], opts["--codec"]) == ("0.5", str(tmp_path), "lossless")
    gloo = rank_command("gloo", args, names, 0, 2, 29501, "hg3h1-eth0")
    assert "--controller" not in gloo and "--pool-size" not in gloo


def test_local_grad_max_sees_each_rank_own_gradients_before_any_aggregation():
    from run.train import LocalGradMax

    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"emb": torch.nn.Embedding(10, 3, sparse=True), "out": torch.nn.Linear(3, 1)}
    )
    seen = LocalGradMax(model)
    x = model["out"](model["emb"](torch.tensor([1, 4, 1]))).sum() * 7
    x.backward()
    grads = [p.grad for p in model.parameters()]
    assert seen.value == pytest.approx(max(_abs_max(g) for g in grads))
    seen.value = 0.0
    for p in model.parameters():
        p.grad = None
    (model["out"](model["emb"](torch.tensor([2]))).sum() * 0.5).backward()
    assert 0 < seen.value < 7  # this step's gradients only


def _abs_max(g: torch.Tensor) -> float:
    return float((g.coalesce().values() if g.is_sparse else g).abs().max())


def test_lowbit8_and_its_codec_options_reach_every_rank():
    """`python -m run --codec lowbit8 --codec-option gamma=0`: the ranks' command lines
    carry both, the switch rank also the controller, and run.train reads the option as a
    number (lowbit8 without error feedback)."""
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from run.jobs import rank_command
    from run.options import codec_options, parser, settle

    args = parser().parse_args(
        ["--codec", "lowbit8", "--codec-option", "gamma=0", "--model", "mlp", "--out", "o"]
    )
    settle(args)
    names = RunNames(3)
    switch = rank_command("switch", args, names, 1, 4, 29500, "eth0")
    gloo = rank_command("gloo", args, names, 1, 4, 29501, "eth0")
    for cmd in (switch, gloo):
        assert cmd[cmd.index("--codec") + 1] == "lowbit8"
        assert cmd[cmd.index("--codec-option") + 1] == "gamma=0"
        assert cmd[cmd.index("--node-rank") + 1] == "1" and cmd[cmd.index("--lr") + 1] == "0.1"
    assert "--controller" in switch and "--controller" not in gloo
    assert codec_options(["gamma=0", "rotate=true", "block=512", "name=x"]) == {
        "gamma": 0,
        "rotate": True,
        "block": 512,
        "name": "x",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        codec_options(["gamma"])
    bad = parser().parse_args(["--codec", "lowbit8", "--codec-option", "=0"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        settle(bad)
    with pytest.raises(SystemExit):  # not a codec
        parser().parse_args(["--codec", "lowbit4"])


def test_peers_first_runs_gloo_and_the_peers_before_the_switch(monkeypatch):
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from run import jobs, options

    order: list[tuple[str, int]] = []
    monkeypatch.setattr(
        jobs, "run_job", lambda mode, net, a, st, port, c=None: order.append((mode, port))
    )
    monkeypatch.setattr(jobs, "counters", lambda names, creds, timeout: "counters")
    state = type("S", (), {"names": RunNames(1)})()
    for first, expected in (
        (False, ["switch", "gloo", "gloo-fp16"]),
        (True, ["gloo", "gloo-fp16", "switch"]),
    ):
        order.clear()
        args = options.parser().parse_args(
            ["--model", "mlp", "--peers", "gloo-fp16"] + (["--peers-first"] if first else [])
        )
        options.settle(args)
        counted, traffic = jobs.run_all(1, args, state, 1)
        assert counted == "counters" and list(traffic) == expected
        assert [m for m, _ in order] == expected
        assert len({p for _, p in order}) == 3  # every job its own rendezvous port


def test_a_target_that_cannot_start_is_refused_with_its_reason(monkeypatch):
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from run.options import parser, settle

    monkeypatch.delenv("HOMAGG_BMV2_OPT", raising=False)
    with pytest.raises(ValueError, match="--target bmv2-opt: bmv2-opt needs HOMAGG_BMV2_OPT"):
        settle(parser().parse_args(["--target", "bmv2-opt"]))


def test_codec_options_of_auto_are_the_controllers_settings(capsys):
    """With --codec auto, --codec-option sets the controller (lag=0): an option of one
    codec (gamma) has nothing to apply to, and the error lists the settings there are."""
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from run.__main__ import main
    from run.options import check_codec_rules, parser

    with pytest.raises(SystemExit) as stop:
        main(["--codec", "auto", "--codec-option", "gamma=0"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "codec 'auto' has no option gamma" in err and "lag" in err and "min_density" in err
    with pytest.raises(SystemExit):
        main(["--codec", "auto", "--codec-option", "lag=2"])
    assert "lag is 0" in capsys.readouterr().err
    p = parser()
    args = p.parse_args(["--codec", "auto", "--codec-option", "lag=0"])
    check_codec_rules(p, args)  # accepted, and the blocking hook made asynchronous
    assert args.overlap == "async"


def test_overlap_summary_prints_auto_choices_leases_and_whether_ranks_agree(tmp_path):
    for r, h in enumerate(([{"0": "host"}], [{"0": "host"}])):
        (tmp_path / f"auto-rank{r}.json").write_text(json.dumps(h))
    last = {"auto_choices": {"host": 30, "lossless": 10}, "leased_steps": 21}
    text = report.overlap_summary([last], tmp_path)
    assert "auto codec choices (bucket-steps): host 30 (75%), lossless 10 (25%); 21 steps" in text
    assert "auto decisions of 1 steps on 2 ranks: alike on every rank" in text
    (tmp_path / "auto-rank1.json").write_text(json.dumps([{"0": "lossless"}]))
    last["leased_steps"] = 0
    text = report.overlap_summary([last], tmp_path)
    assert "DIFFERENT" in text and "without an agreement" not in text


def test_the_runs_controller_serves_its_metrics_on_loopback(tmp_path):
    from types import SimpleNamespace

    from homagg.control.config import parse_config
    from run.control import controller_toml, metrics_url

    names = RunNames(3)
    creds = SimpleNamespace(controller_keys=dict, operators=list)
    switch = {"name": "s1", "address": "unix:/x.sock", "mac": "02:00:00:00:00:fe"}
    switch["service_ip"] = names.service_ip
    text = controller_toml([switch], tmp_path, names, creds)  # type: ignore[arg-type]
    config = parse_config(tomllib.loads(text), tmp_path)
    assert config.metrics_listen == "127.0.0.1:9703" and not config.metrics_non_loopback
    # the run's pool is its controller's default: a --script's job, which names none, gets it
    text = controller_toml([switch], tmp_path, names, creds, 8)  # type: ignore[arg-type]
    assert parse_config(tomllib.loads(text), tmp_path).default_pool_size == 8
    assert metrics_url(names) == "http://127.0.0.1:9703/metrics"


def test_the_first_line_says_which_target_runs_and_when_auto_missed_bmv2():
    from run.options import describe_target

    assert describe_target("auto", "bmv2") == "switch target bmv2 (BMv2's simple_switch_grpc)"
    missed = describe_target("auto", "refswitch")
    assert missed.startswith("switch target refswitch (the reference switch")
    assert "simple_switch_grpc is not installed" in missed
    assert "README" in describe_target("auto", "ebpf")
    assert "README" not in describe_target("refswitch", "refswitch")


def test_the_summary_says_whose_numbers_and_the_plot_has_the_switch_packet_rate(tmp_path):
    switch = [dict(s, switch_packets=400) for s in _steps(4)]  # 0.1 s a step
    assert report.packet_rate(switch[0]) == pytest.approx(4000.0)
    assert report.packet_rate(_steps(1)[0]) == 0.0  # gloo: nothing through the switch
    assert "means over the ranks" in report.SUMMARY_HEAD and "rank 0's" in report.SUMMARY_HEAD
    report.plot({"switch": switch, "gloo": _steps(4)}, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_two_level_topology_makes_a_tree_the_controller_accepts(tmp_path):
    """make run TOPO=two-level: 2 leaves x 4 hosts under a spine, the controller's host on the
    spine; the controller's configuration names each leaf's parent and ports."""
    from types import SimpleNamespace

    from homagg.control.config import parse_config
    from homagg.lab.addresses import CONTROLLER_INDEX, host_entry
    from run.control import controller_toml, switch_tables
    from run.net import UPLINK_PORT, Topology
    from run.options import topology_file

    topo = Topology.load(topology_file(Path("two-level")))
    assert (topo.hosts, topo.leaves, topo.per_leaf) == (8, 2, 4)
    assert [topo.place(i) for i in (0, 3, 4, 7)] == [(0, 1), (0, 4), (1, 1), (1, 4)]
    with pytest.raises(ValueError, match="divide hosts"):
        Topology(hosts=7, leaves=2)
    names = RunNames(3)
    process = SimpleNamespace(address="unix:/x.sock", target="refswitch")
    net = SimpleNamespace(
        switches=[SimpleNamespace(name=n, process=process) for n in ("hg3s", "hg3s1", "hg3s2")]
    )
    hosts = [host_entry(i, 3) for i in range(8)] + [host_entry(CONTROLLER_INDEX, 3)]
    tables = switch_tables(net, topo, hosts, names)  # type: ignore[arg-type]
    for i, t in enumerate(tables):
        t["address"] = f"unix:/x{i}.sock"
    creds = SimpleNamespace(controller_keys=dict, operators=list)
    text = controller_toml(tables, tmp_path, names, creds)  # type: ignore[arg-type]
    spine, _, leaf2 = parse_config(tomllib.loads(text), tmp_path).switches
    assert [h.ip for h in spine.hosts] == [names.controller_ip] and spine.parent == ""
    assert (leaf2.parent, leaf2.parent_port, leaf2.port_on_parent) == ("hg3s", UPLINK_PORT, 2)
    assert [(h.ip, h.switch_port) for h in leaf2.hosts] == [
        (names.host_ip(i), i - 3) for i in range(4, 8)
    ]
    assert len({t["service_ip"] for t in tables} | {t["mac"] for t in tables}) == 6


def test_a_command_that_does_not_answer_is_tried_again_then_said_not_to(tmp_path):
    """run/control.py's output_within: a second try waits twice as long; a command that
    answers neither time is a line naming the option to raise, not a failed run."""
    from run.control import output_within

    once = tmp_path / "tried"  # the first try sleeps past its wait, the second answers
    slow_once = (
        "import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); first = not p.exists(); "
        "p.touch(); time.sleep(60 if first else 0); print('counted')"
    )
    argv = [sys.executable, "-c", slow_once, str(once)]
    assert output_within(argv, 1.5, dict(os.environ), "--x-timeout") == "counted\n"
    never = [sys.executable, "-c", "import time; time.sleep(60)"]
    start = time.monotonic()
    text = output_within(never, 0.2, dict(os.environ), "--x-timeout")
    assert time.monotonic() - start < 5  # 0.2 s, then 0.4 s: each try's child killed
    assert "no answer within 0.2 s, nor within 0.4 s" in text and "--x-timeout 0.8" in text
    assert "load average" in text


def test_make_run_pool_is_the_controllers_default_where_the_tenant_quota_holds_two_jobs(
    tmp_path,
):
    """make run's default pool: the controller's on one switch and on the two-level tree;
    on any tree it allows, small enough that the tenant's slot quota (the run's operator
    table sets none: a tenant's default) holds the run's job and one a crash left, each with
    its pool on every switch, and never below the 8 it was (docs/performance.md)."""
    pytest.importorskip("mininet.net", reason="Debian's mininet is not installed")
    from homagg.api.credentials import TENANT_MAX_SLOTS
    from homagg.control.config import ControllerConfig
    from run.credentials import TENANT_MAX_RUN_JOBS
    from run.net import MAX_LEAVES, Topology
    from run.options import parser, settle

    tenant = make_run_credentials(tmp_path / "c", "10.0.3.100").operators()[0]
    assert "max_slots" not in tenant and tenant["max_jobs"] == TENANT_MAX_RUN_JOBS
    for argv in ([], ["--topo", "two-level"]):
        args = parser().parse_args(argv)
        settle(args)
        assert args.pool_size == ControllerConfig.default_pool_size == 64, argv
    args = parser().parse_args(["--pool-size", "8"])
    settle(args)
    assert args.pool_size == 8  # asked for: kept
    for bad, room in (("0", 1024), ("1025", 1024), ("342", 341)):
        topo_argv = ["--topo", "two-level"] if room == 341 else []
        with pytest.raises(ValueError, match=f"--pool-size {bad}: expected 1 to {room} slots"):
            settle(parser().parse_args(["--pool-size", bad, *topo_argv]))
    for leaves in (0, *range(2, MAX_LEAVES + 1)):
        topo = tmp_path / f"leaves{leaves}.toml"
        topo.write_text(f"[topology]\nhosts = {leaves or 4}\nleaves = {leaves}\n")
        args = parser().parse_args(["--topo", str(topo)])
        settle(args)
        switches = Topology.load(topo).switches
        assert switches == (leaves + 1 if leaves else 1)
        assert 8 <= args.pool_size <= 64, leaves
        assert TENANT_MAX_RUN_JOBS * args.pool_size * switches <= TENANT_MAX_SLOTS, leaves
    assert args.pool_size == 30  # 16 leaves and the spine: 1,024 slots // (2 x 17)


def test_a_step_record_sums_the_ranks_cpu() -> None:
    """A step's record averages the times over the ranks but sums their CPU (what the
    cores of one machine spent on the step), from _timed_step's 17 columns."""
    from run.train import _record

    t = torch.tensor([0.5 * 4, 0.02 * 4, *([0.0] * 14), 0.07], dtype=torch.float64)
    rec = _record(3, t, 4, 100, 0.1, {})
    assert rec["seconds"] == pytest.approx(0.02) and rec["cpu_seconds"] == pytest.approx(0.07)


class _Exited:
    """A finished rank process (follow's view of it)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int:
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        return self.code


TORCHRUN_SIGNALLED = """Root Cause (first observed failure):
[0]:
  rank      : 3 (local_rank: 0)
  exitcode  : -6 (pid: 14182)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 14182
"""


def test_a_rank_killed_by_a_signal_is_told_from_a_failing_rank(tmp_path: Path) -> None:
    from run.jobs import RankSignalled, follow

    logs = [tmp_path / f"gloo-rank{i}.log" for i in range(2)]
    logs[0].write_text("[gloo] step 1/2\n")
    logs[1].write_text("malloc(): unaligned tcache chunk detected\n" + TORCHRUN_SIGNALLED)
    with pytest.raises(RankSignalled, match=r"rank\(s\) \[1\]") as got:
        follow("gloo", [_Exited(0), _Exited(1)], logs, 5.0)  # type: ignore[list-item]
    assert got.value.signals == ["SIGABRT"]
    logs[1].write_text("ValueError: bad input\n  exitcode  : 1 (pid: 3)\n")
    with pytest.raises(RuntimeError, match="bad input") as plain:
        follow("gloo", [_Exited(0), _Exited(1)], logs, 5.0)  # type: ignore[list-item]
    assert not isinstance(plain.value, RankSignalled)


def test_a_reference_run_killed_by_a_signal_runs_once_more(tmp_path: Path, capsys) -> None:
    from run.jobs import RankSignalled, run_reference
    from run.script import Traffic

    calls: list[int] = []

    def crashes(times: int):
        def job(port: int) -> Traffic:
            calls.append(port)
            if len(calls) <= times:
                (tmp_path / "gloo-rank0.log").write_text(f"attempt {len(calls)}\n")
                raise RankSignalled("the gloo run failed on rank(s) [0]", ["SIGSEGV"])
            return Traffic(seconds=1.0)

        return job

    assert run_reference("gloo", crashes(1), (29501, 29503), tmp_path).seconds == 1.0
    assert calls == [29501, 29503]  # the second attempt on a port of its own
    assert (tmp_path / "gloo-rank0-crashed.log").read_text() == "attempt 1\n"
    assert "killed by SIGSEGV" in capsys.readouterr().out
    calls.clear()
    with pytest.raises(RankSignalled):  # a second crash is the run's error
        run_reference("gloo", crashes(2), (29501, 29503), tmp_path)
    calls.clear()

    def fails(port: int) -> Traffic:
        calls.append(port)
        raise RuntimeError("the gloo run failed on rank(s) [1]: ValueError")

    with pytest.raises(RuntimeError, match="ValueError"):  # not a crash: no second run
        run_reference("gloo", fails, (29501, 29503), tmp_path)
    assert calls == [29501]
