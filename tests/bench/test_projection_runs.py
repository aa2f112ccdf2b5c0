"""The projection's check against Mininet runs, from made-up run directories (no root, no
Mininet): the first line and config it parses, the step medians, the predicted-vs-measured
row's arithmetic, the refusals and the summary's count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calibration_record import RECORD

from bench import projection_runs as pr
from bench.projection_model import ModelError
from bench.projection_run_start import RunSpec, star_hosts

FIRST = (
    "make run: run 4 on switch target refswitch (the reference switch, embedded in Python), "
    "4 hosts, model mlp, codec fixed_point, overlap blocking, links unshaped, 20 steps, pool 64 "
    "(stop it with `make stop RUN=4`)\ncontroller on ...\n"
)
ELEMENTS = 85_000  # 333 ADD packets (+1 status cell: 333 still), 1 MAX packet


def _step(i: int, switch: bool) -> dict:
    rec = {"step": i, "seconds": 0.3 if switch else 0.13, "tx_bytes": 5.4e5}
    rec["agg_dense"] = 4.0 * ELEMENTS if switch else 0.0
    if switch:
        rec |= {
            "switch_seconds": 0.25,
            "agreement_seconds": 0.02,
            "encode_seconds": 0.001,
            "wait_seconds": 0.248,
            "decode_seconds": 0.001,
            "switch_packets": 2 * 4 * 335,  # the codec's 334 and the verdict
            "retransmissions": 1,
        }
    return rec


def _run_dir(tmp: Path, first: str = FIRST, tree: bool = False, steps: int = 6) -> Path:
    d = tmp / "run"
    d.mkdir()
    (d / "run.log").write_text(first)
    (d / "controller.toml").write_text('[[switch]]\nname = "s1"\n' + ('parent = "s"\n' * tree))
    (d / "controller.log").write_text("job 1 (make-run) created: 4 ranks, pool size 16, ...")
    for mode in ("switch", "gloo"):
        lines = [json.dumps(_step(i, mode == "switch")) for i in range(steps)]
        (d / f"{mode}.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_first_line_config_and_pool_are_parsed() -> None:
    info = pr.parse_first_line(FIRST, levels=2, pool=16)
    assert (info.target, info.hosts, info.model, info.codec) == (
        "refswitch",
        4,
        "mlp",
        "fixed_point",
    )
    assert (info.overlap, info.link_mbit, info.levels, info.pool_size) == ("blocking", 0.0, 2, 16)
    shaped = FIRST.replace("links unshaped", "links 100 Mbit/s (htb)").replace(
        "codec fixed_point", "codec lossless gamma=0"
    )
    assert pr.parse_first_line(shaped).link_mbit == 100.0
    assert pr.parse_first_line(shaped).codec == "lossless"
    assert pr.switch_levels('name = "a"\nparent = "s"\n') == 2
    assert pr.switch_levels('name = "a"\n# parent = "s"\n') == 1
    assert pr.pool_size("... pool size 32, slots 0+32") == 32
    assert pr.pool_size("nothing") == pr.DEFAULT_POOL
    with pytest.raises(ModelError, match=r"run\.log"):
        pr.parse_first_line("something else")


def test_step_medians_skip_the_warm_up_and_derive_the_computation() -> None:
    lines = [json.dumps({"seconds": 9.0, "switch_seconds": 9.0})] * 2
    lines += [json.dumps(_step(i, True)) for i in range(3)]
    got = pr.step_medians(lines)
    assert got["seconds"] == 0.3 and got["steps"] == 3
    assert got["compute_seconds"] == pytest.approx(0.3 - 0.25 - 0.02)
    assert pr.step_medians([json.dumps(_step(0, False))] * 3)["switch_seconds"] == 0.0
    with pytest.raises(ModelError, match="warm-up"):
        pr.step_medians(lines[:2])


def test_row_puts_the_model_beside_the_run(tmp_path: Path) -> None:
    run = pr.load_run(_run_dir(tmp_path))
    assert run.info.pool_size == 16 and run.info.levels == 1
    assert run.load == {"switch": None, "gloo": None}  # not sampled: a share of 1
    r = pr.row(run, RECORD, 0.0, 2.0)
    assert r["packets_predicted"] == 335 and r["packets_measured"] == 335
    # the reference switch's process: W contributions a packet at 50 us, and 3 round trips
    assert r["switch_limit"] == "switch"  # its packet rate: one core a contribution
    assert r["switch_predicted_s"] == pytest.approx(4 * 335 * 50e-6 + 3 * 200e-6)
    assert r["switch_measured_s"] == 0.25
    assert r["gloo_measured_s"] == pytest.approx(0.13 - (0.3 - 0.25 - 0.02))
    # gloo's ring: 2(W-1)/W of 340 kB a rank, its frames and ACKs through the switch, each
    # at the calibrated forwarding cost of its size (not a contribution's)
    wire = r["gloo_tx_predicted"] / (1 + 0.5 * 66 / 1514)
    data = 4 * wire / 1514
    forward = data * (10e-6 + 1450 * 10e-9) + 0.5 * data * (10e-6 + 2 * 10e-9)
    assert r["forward_model_s"] == pytest.approx(forward)
    # the ring's latency overlaps the forwarding it waits on: the larger of the two
    latency = 100e-6 + 6 * 50e-6
    assert r["gloo_predicted_s"] == pytest.approx(max(forward, latency))
    assert r["gloo_limit"] == "switch's forwarding"
    # the agreement: a small all_gather (W - 1 ring steps) whose every step's two messages
    # (gloo's receive announcement, then the data) cross the idle switch (its calibrated
    # latency), and
    # whose 4 hops' frames (two messages and their ACKs, 66 bytes each) it forwards in turn
    step = 50e-6 + 2 * 30e-6 + 4 * 4 * 10.02e-6
    assert r["seal_s"] == pytest.approx(100e-6 + 3 * step)
    # started after the step's last bucket, but 4 ranks on 2 cores: the next step's 30 ms
    # of compute cover none of it; with a core a rank they cover all of it
    assert r["agreement_predicted_s"] == pytest.approx(r["seal_s"])
    assert pr.row(run, RECORD, 0.0, 4.0)["agreement_predicted_s"] == 0.0
    assert pr.exposed_seal(0.05, 0.03) == pytest.approx(0.02)
    assert pr.exposed_seal(0.05, 0.03, ranks=2, cores=2.0) == pytest.approx(0.02)
    assert pr.exposed_seal(0.05, 0.03, ranks=4, cores=2.0) == pytest.approx(0.05)
    assert pr.exposed_seal(0.05, 0.06, ranks=8, cores=0.0) == 0.0  # a machine a rank
    assert r["agreement_measured_s"] == 0.02
    assert r["contribution_model_s"] == pytest.approx(50e-6)
    lines = pr.report([r])
    assert any("| run | refswitch | 4 | 1 | switch, fixed_point |" in x for x in lines)
    assert pr.summary([r]).endswith("in 0/3 predictions (switch 0/1, gloo 0/1, agreement 0/1)")
    assert pr.summary([{**r, "gloo_predicted_s": r["gloo_measured_s"] * 1.2}]).endswith(
        "in 1/3 predictions (switch 0/1, gloo 1/1, agreement 0/1)"
    )


def test_a_configuration_run_twice_is_checked_on_its_medians(tmp_path: Path) -> None:
    r = pr.row(pr.load_run(_run_dir(tmp_path)), RECORD, 0.0, 2.0)
    measured = r["switch_predicted_s"]
    # one run 30% slower than predicted, one 10% faster, one 5% slower: each a run of its
    # own, the configuration's median within the tolerance
    runs = [{**r, "switch_measured_s": measured * f} for f in (1 / 0.7, 1 / 1.1, 1 / 0.95)]
    configs = pr.configurations(runs)
    assert len(configs) == 1 and configs[0]["runs"] == 3
    assert configs[0]["switch_measured_s"] == pytest.approx(measured / 0.95)
    line = pr.summary(runs)
    assert "runs: within 25% of the measured communication in" in line
    assert "(switch 2/3," in line and "configurations (median of their runs)" in line
    assert "(switch 1/1," in line.split(";")[1]
    other = {**r, "workers": 8}  # another configuration: no medians to report for one run each
    assert ";" not in pr.summary([r, other])
    assert any("| refswitch | 4 | 1 | 16 | 3 |" in x for x in pr.report(runs))


def test_a_chain_of_hand_offs_gets_the_share_the_other_load_leaves(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    # 6 ready groups on 2 cores, 5 of them the run's own: side by side a process gets a
    # third of a core; alone (the agreement's ring) it competes with the one other group
    samples = [
        {
            "t": t,
            "runnable": 9,
            "groups": 6,
            "own_groups": 5,
            "steps": {"switch": k, "gloo": 0},
            "procs": {},
        }
        for t, k in ((0.0, 2), (1.0, 4), (2.0, 6))
    ]
    (d / pr.LOAD_LOG).write_text("\n".join(json.dumps(x) for x in samples) + "\n")
    run = pr.load_run(d)
    load = run.load["switch"]
    assert load is not None and load.other_groups == 1.0
    assert load.share(2.0) == pytest.approx(1 / 3) and load.latency_share(2.0) == 1.0
    (tmp_path / "q").mkdir()
    quiet = pr.row(pr.load_run(_run_dir(tmp_path / "q")), RECORD, 0.0, 2.0)
    r = pr.row(run, RECORD, 0.0, 2.0)
    assert r["seal_s"] == pytest.approx(quiet["seal_s"])
    assert r["switch_predicted_s"] > 2.5 * quiet["switch_predicted_s"]


def test_the_machines_load_slows_every_process_by_its_share(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    quiet = pr.row(pr.load_run(d), RECORD, 0.0, 2.0)
    # 8 ready scheduling groups on 2 cores: a ready process gets a quarter of one
    samples = [
        {"t": t, "runnable": 20, "groups": 8, "steps": {"switch": k, "gloo": 0}, "procs": {}}
        for t, k in ((0.0, 2), (1.0, 4), (2.0, 6))
    ]
    (d / pr.LOAD_LOG).write_text("\n".join(json.dumps(x) for x in samples) + "\n")
    run = pr.load_run(d)
    assert run.load["switch"] is not None and run.load["gloo"] is None
    assert run.load["switch"].share(2.0) == 0.25 and run.load["switch"].steps == 4
    loaded = pr.row(run, RECORD, 0.0, 2.0)
    assert loaded["share_switch"] == 0.25 and loaded["share_gloo"] == 1.0
    assert loaded["switch_predicted_s"] == pytest.approx(4 * quiet["switch_predicted_s"])
    assert loaded["gloo_predicted_s"] == quiet["gloo_predicted_s"]


def test_a_tree_crosses_more_switches_and_its_leaves_share_the_work(tmp_path: Path) -> None:
    first = FIRST.replace("4 hosts", "8 hosts")
    d = _run_dir(tmp_path, first, tree=True)
    (d / "controller.toml").write_text('parent = "s"\n' * 2)  # two leaves
    run = pr.load_run(d)
    assert (run.info.levels, run.info.leaves) == (2, 2)
    r = pr.row(run, RECORD, 0.0, 2.0)
    star = pr.parse_first_line(first)
    # a ring hop between leaves (2 of 8) crosses three switches: 1.5 a frame on average
    assert pr.crossings(star) == 1.0 and pr.crossings(run.info) == 1.5
    # the busiest leaf: its 4 ranks' hops and the one entering it, of the 12 crossings
    assert pr.busiest_fraction(run.info) == pytest.approx(5 / 8 / 1.5)
    # the switches absorb 8 contributions, 2 partials at the top, 2 results at the leaves
    # a slot (a leaf 4 + 1 of them); with the 8 ranks' CPU, on 2 cores: the CPU bounds it
    assert r["switch_limit"] == "cpu"
    cpu = (8 * 335 * 30e-6 + 12 * 335 * 50e-6) / 2
    assert r["switch_predicted_s"] == pytest.approx(cpu + 3 * 2 * 200e-6)
    # every step of the ring has a hop from one leaf to another: three switches to cross
    assert pr.path_crossings(star) == 1 and pr.path_crossings(run.info) == 3
    # and the busiest leaf forwards its 4 ranks' hops and the one entering it
    assert pr.busiest_hops(star) == 8 and pr.busiest_hops(run.info) == 5
    step = 50e-6 + 2 * 3 * 30e-6 + 5 * 4 * 10.02e-6
    assert r["seal_s"] == pytest.approx(100e-6 + 7 * step)


def test_runs_the_model_does_not_describe_are_refused(tmp_path: Path) -> None:
    ncf = _run_dir(tmp_path, FIRST.replace("model mlp", "model ncf"))
    with pytest.raises(ModelError, match="--model mlp"):
        pr.load_run(ncf)
    (ncf / "gloo.jsonl").unlink()
    with pytest.raises(ModelError, match=r"missing gloo\.jsonl"):
        pr.load_run(ncf)
    bmv2 = pr.parse_first_line(FIRST.replace("target refswitch", "target bmv2"))
    with pytest.raises(ModelError, match="--switch-pps"):
        pr.costs_for(RECORD, bmv2.target, 0.0)
    costs, pps = pr.costs_for(RECORD, "bmv2", 3500.0)
    assert pps == 3500.0 and costs.switch_cpu_s == 0.0 and costs.worker_cpu_s == 30e-6
    calibrated = {
        **RECORD,
        "targets": {**RECORD["targets"], "bmv2": RECORD["targets"]["refswitch"]},
    }
    costs, pps = pr.costs_for(calibrated, "bmv2", 0.0)  # calibrated: its own costs and rate
    assert pps == pytest.approx(1 / 50e-6) and costs.switch_cpu_s == 50e-6


def test_started_runs_command() -> None:
    spec = RunSpec("refswitch", "two-level", 12, 32)
    cmd = spec.command(Path("/o") / spec.name)
    assert cmd[:2] == ["-m", "run"] and "--topo" in cmd and "--hosts" not in cmd
    assert cmd[cmd.index("--pool-size") + 1] == "32" and cmd[-1].endswith("two-level-pool32")
    star = RunSpec().command(Path("o"))
    assert star[star.index("--hosts") + 1] == "4" and "--topo" not in star
    two = RunSpec(topo="star2").command(Path("o"))
    assert two[two.index("--hosts") + 1] == "2" and RunSpec(topo="star2").name.startswith(
        "refswitch-star2-"
    )
    assert [star_hosts(t) for t in ("star", "star8", "star0", "starx", "two-level")] == [
        4,
        8,
        0,
        0,
        0,
    ]
