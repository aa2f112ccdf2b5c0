"""The projection's calibration record and its check's report, from made-up measurements
(no root, no switch): the costs the model reads, the refusals, the predicted-vs-measured
rows and the summary's count."""

from __future__ import annotations

from pathlib import Path

import pytest
from calibration_record import RECORD

from bench import calibration, projection_check
from bench.projection_model import ModelError


def test_costs_of_a_calibrated_target() -> None:
    costs = calibration.costs_of(RECORD, "refswitch")
    assert costs.worker_packet_s == costs.worker_cpu_s == 30e-6
    assert costs.switch_cpu_s == 50e-6 and costs.alpha_s == 50e-6
    assert calibration.switch_pps_of(RECORD, "refswitch") == pytest.approx(20_000)
    cluster, pps = calibration.cluster_costs(RECORD, "refswitch")
    assert cluster.worker_cpu_s == cluster.switch_cpu_s == 0.0  # a host each: no shared cores
    assert pps == pytest.approx(20_000)


def test_missing_calibrations_say_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="--calibrate"):
        calibration.costs_of(RECORD, "ebpf")
    with pytest.raises(ModelError, match="--calibrate"):
        calibration.load(tmp_path / "none.json")
    calibration.save(RECORD, tmp_path / "c.json")
    assert calibration.load(tmp_path / "c.json") == RECORD


def _measured(secs: float, gloo: float) -> dict:
    rep = {"secs": secs, "worker_cpu": 0.25, "switch_cpu": 0.4, "packets": 2 * 4098}
    rep.update(retx=0, gloo=gloo, gloo_cpu=0.01)
    return {"refswitch": {2: {"cores": 2.0, "reps": [rep, rep, rep]}}}


def test_check_rows_report_and_summary() -> None:
    n = 1 << 20
    rows = projection_check.rows(RECORD, _measured(0.41, 0.0045), n)
    (row,) = rows
    # W = 2, 4,098 packets each: the switch process's 2 x 4,098 x 50 us is the bound
    assert row["switch_predicted_s"] == pytest.approx(2 * 4098 * 50e-6 + 2 * 200e-6)
    # the workers' 30 us a packet alone, 2 us more a thread: 32 us at W = 2
    assert row["switch_cpu_predicted_s"] == pytest.approx(2 * 4098 * (32e-6 + 50e-6))
    # gloo: a call, 2 steps and 4 n bytes at the host's 1 ns; its CPU 4.5 ms against 10
    assert row["gloo_predicted_s"] == pytest.approx(100e-6 + 2 * 50e-6 + 4 * n * 1e-9)
    assert row["switch_limit"] == "switch"
    assert row["worker_us_measured"] == pytest.approx(0.25 / (2 * 4098) * 1e6)
    assert row["switch_bytes_measured"] == row["switch_bytes_predicted"]
    text = "\n".join(projection_check.report(RECORD, rows, n))
    assert "| refswitch | switch, fixed point | 2 |" in text and "(miss)" in text  # gloo CPU
    assert projection_check.summary(rows) == (
        "projection check: within 25% of the measured step time in 2/2 rows, of the "
        "measured CPU in 1/2"
    )
