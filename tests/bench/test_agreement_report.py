"""bench.agreement's tables from given times, and its NCF round-trip count (in process)."""

from __future__ import annotations

from bench.agreement import WAYS, coalesced_round_trips, report, round_trips, trips_report


def test_the_report_gives_percentiles_and_the_ratio_to_gloo():
    times = {
        WAYS[0]: [0.001] * 99 + [0.010],
        WAYS[1]: [0.004] * 100,
        "before": [0.040] * 10,
        "now": [0.030] * 10,
        "one round": [0.020] * 10,
        "fallbacks": [0.0, 0.0, 0.0],
    }
    lines = report({"ebpf": times}, world=4, rounds=2)
    rows = [line for line in lines if line.startswith("| ebpf")]
    assert rows[0].startswith("| ebpf | switch verdict | 1.00 |") and "4.00x" in rows[0]
    assert rows[1].startswith("| ebpf | gloo MAX | 4.00 | 4.00 | 1.00x")
    assert rows[2] == "| ebpf | before | 40.0 | 40.0 | 1.00x | 10 | 0 |"
    assert rows[3] == "| ebpf | now | 30.0 | 30.0 | 1.33x | 10 | 0 |"
    assert rows[4] == "| ebpf | one round | 20.0 | 20.0 | 2.00x | 10 | 0 |"


def test_the_exponents_in_the_or_phase_save_a_round_trip_per_bucket():
    before, now = round_trips(4, "max"), round_trips(4, "or")
    assert [b - n for b, n in zip(before, now, strict=True)] == [1, 1, 1]
    lines = trips_report(4)
    assert lines[-2].endswith(f"| {sum(now) + 3} | 1 |")  # a verdict a bucket, one seal


def test_one_round_takes_the_trips_of_the_largest_bucket_and_one_verdict():
    one, alone = coalesced_round_trips(4), round_trips(4, "or")
    # the OR phases (one packet each) share one trip, the ADD phases share theirs: no more
    # than the largest bucket's and one per extra pool's worth of packets
    assert max(alone) <= one < sum(alone)
    assert trips_report(4)[-1].endswith(f"| [{one + 1}] | {one + 1} | 1 |")
