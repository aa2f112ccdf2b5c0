"""`aggctl top`'s view and screen without a controller: rates from two samples (resets and
new jobs give no rate), what a tenant's refused calls leave out, the screen at 80 columns
and narrower, --json's document, and a controller lost while top runs."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys

import grpc
import pytest

from homagg.api import jobs_pb2 as pb
from homagg.control import top
from homagg.control.top_screen import amount, render, to_json
from homagg.control.top_view import Sample, Sampler, build_view


def job(job_id: int, name: str = "train", switch: str = "s1", state: str = "ready") -> pb.JobInfo:
    return pb.JobInfo(
        gave_ups=2,
        job_id=job_id,
        name=name,
        state=state,
        switch=switch,
        world_size=2,
        joined=2,
        codec="lossless",
        pool_size=32,
    )


def counters(
    packets: dict[int, int], contrib: int, resent: int, dup: int
) -> pb.GetCountersResponse:
    sw = pb.SwitchCounters(
        switch="s1",
        ingress_drops=[pb.CounterValue(name="DUPLICATE", index=9, packets=dup)],
        egress_drops=[pb.CounterValue(name="NO_RECIPIENT", index=14, packets=0)],
        events=[
            pb.CounterValue(name="CONTRIBUTION", index=0, packets=contrib),
            pb.CounterValue(name="RESULT", index=1, packets=contrib // 2),
            pb.CounterValue(name="RESENT", index=2, packets=resent),
        ],
        jobs=[pb.JobCounters(job_id=j, packets=n, bytes=n * 1082) for j, n in packets.items()],
    )
    return pb.GetCountersResponse(switches=[sw])


STATUS = pb.StatusResponse(
    uptime_s=3725,
    switches=[
        pb.SwitchStatus(name="s1", connected=True, role="primary", slots_used=64, slots_total=4096)
    ],
)


def sample(at: float, jobs: list, ctr: pb.GetCountersResponse | None, **kw) -> Sample:
    return Sample(at, 1.7e9 + at, jobs, kw.pop("status", STATUS), ctr, **kw)


def test_rates_are_counter_deltas_over_the_time_between_samples():
    before = sample(10.0, [job(1)], counters({1: 1000}, 5000, 10, 4))
    after = sample(12.0, [job(1), job(2, "new")], counters({1: 9000, 2: 50}, 21000, 16, 10))
    view = build_view(before, after, "ctl:1")
    [sw] = view.switches
    assert (sw.contributions_per_s, sw.results_per_s, sw.resent_per_s) == (8000, 4000, 3)
    assert sw.drops_per_s == 3 and sw.drops_per_s_by_reason == {"DUPLICATE": 3}
    one, two = sw.jobs
    assert (one.packets, one.packets_per_s, one.bytes_per_s) == (9000, 4000, 4000 * 1082)
    assert (two.packets, two.packets_per_s) == (50, None)  # no earlier reading: no rate
    assert view.interval_s == 2.0 and view.notes == []


def test_a_restarted_switch_gives_no_rate_instead_of_a_negative_one():
    before = sample(0.0, [job(1)], counters({1: 9000}, 9000, 5, 5))
    after = sample(1.0, [job(1)], counters({1: 10}, 10, 0, 0))
    [sw] = build_view(before, after, "c").switches
    assert sw.contributions_per_s is None and sw.drops_per_s is None
    assert sw.jobs[0].packets_per_s is None and sw.jobs[0].packets == 10


def test_the_first_view_has_no_rates_and_says_when_they_come():
    view = build_view(None, sample(0.0, [job(1)], counters({1: 5}, 5, 0, 0)), "c")
    assert view.switches[0].contributions_per_s is None and view.interval_s is None
    assert view.notes == ["rates from the next refresh on"]


class Refused(grpc.RpcError, grpc.Call):
    """A PERMISSION_DENIED answer as the client raises it."""

    def code(self):
        return grpc.StatusCode.PERMISSION_DENIED

    def details(self):
        return "GetCounters needs an admin credential"


class TenantClient:
    def __init__(self):
        self.asked: list[str] = []

    def status(self):
        self.asked.append("Status")
        raise Refused()

    def counters(self):
        self.asked.append("GetCounters")
        raise Refused()

    def list_jobs(self, include_ended):
        self.asked.append("ListJobs")
        return pb.ListJobsResponse(jobs=[job(7, "mine")])


def test_a_tenant_sees_its_jobs_without_counters_and_one_line_why():
    client = TenantClient()
    sampler = Sampler(client)
    first, second = sampler.take(), sampler.take()
    assert client.asked == ["Status", "ListJobs", "GetCounters", "ListJobs"]  # refused once
    view = build_view(first, second, "c")
    [sw] = view.switches
    assert sw.name == "s1" and sw.connected is None and [j.job_id for j in sw.jobs] == [7]
    assert sw.jobs[0].packets_per_s is None
    screen = render(view, 80)
    assert "mine" in screen and "switch s1\n" in screen
    assert "\njobs shown without counters (GetCounters: PERMISSION_DENIED: GetCounters" in screen
    assert "\nswitch state not shown (Status: PERMISSION_DENIED: " in screen
    assert len(view.notes) == 2 and all(len(line) <= 80 for line in screen.splitlines())


def test_other_errors_are_not_taken_for_a_refusal():
    class Down(TenantClient):
        def status(self):
            raise grpc.RpcError("down")

    with pytest.raises(grpc.RpcError):
        Sampler(Down()).take()


def test_jobs_without_a_switch_are_listed_last():
    cur = sample(1.0, [job(3, "later", switch="", state="waiting"), job(1)], None)
    names = [sw.name for sw in build_view(None, cur, "c").switches]
    assert names == ["s1", ""]
    assert "no switch yet" in render(build_view(None, cur, "c"))


def _screen(width: int, height: int | None = None) -> str:
    before = sample(0.0, [job(1, "resnet50-team-a")], counters({1: 0}, 0, 0, 0))
    after = sample(1.0, [job(1, "resnet50-team-a")], counters({1: 12345}, 24690, 7, 2))
    return render(build_view(before, after, "10.0.0.100:50051"), width, height)


def test_the_screen_at_80_columns():
    screen = _screen(80)
    lines = screen.splitlines()
    assert all(len(line) <= 80 for line in lines) and ">" not in screen
    assert lines[0].startswith("aggctl top  10.0.0.100:50051  up 1h02m  1 job  rates over 1.0s")
    assert lines[2] == "switch s1  primary  slots 64/4096"
    assert lines[3] == "  24.7k contrib/s  12.3k results/s  7 resent/s  2 drops/s: DUPLICATE 2"
    header, row = lines[4], lines[5].split()
    assert re.split(r"\s{2,}", header.strip()) == [
        "JOB",
        "NAME",
        "STATE",
        "RANKS",
        "CODEC",
        "PKT/S",
        "MB/S",
        "PACKETS",
        "GAVE UP",
    ]  # POOL, the least needed column, did not fit
    assert row == [
        "1",
        "resnet50-team-a",
        "ready",
        "2/2",
        "lossless",
        "12.3k",
        "13.4",
        "12.3k",
        "2",
    ]


def test_a_narrow_terminal_loses_the_least_needed_columns_then_line_ends():
    header = _screen(50).splitlines()[4].split()
    assert header == ["JOB", "NAME", "STATE", "RANKS", "PKT/S", "MB/S"]
    assert all(len(line) <= 50 for line in _screen(50).splitlines())
    tiny = _screen(10).splitlines()  # drawn 20 wide: the terminal wraps the rest
    assert tiny[4].split() == ["JOB", "STATE", "PKT/S"] and max(map(len, tiny)) <= 20
    assert tiny[0].endswith(">")


def test_a_short_terminal_says_how_many_lines_are_left_out():
    lines = _screen(80, 4).splitlines()
    assert len(lines) == 4 and lines[-1] == "... 3 more lines"


def test_json_is_one_document_with_every_field():
    before = sample(0.0, [job(1)], counters({1: 0}, 0, 0, 0))
    doc = to_json(build_view(before, sample(0.5, [job(1)], counters({1: 10}, 20, 0, 0)), "c"))
    line = json.dumps(doc)
    assert "\n" not in line and json.loads(line) == doc
    assert doc["switches"][0]["jobs"][0]["packets_per_s"] == 20.0
    assert doc["switches"][0]["jobs"][0]["gave_ups"] == 2
    assert doc["switches"][0]["slots_used"] == 64 and doc["interval_s"] == 0.5


AMOUNTS = [(None, "-"), (0, "0"), (7.25, "7.2"), (13.36, "13.4"), (950, "950")]
AMOUNTS += [(12345, "12.3k"), (99999, "100k"), (4.1e6, "4.1M"), (2e9, "2.0G")]


@pytest.mark.parametrize(
    ("value", "text"),
    AMOUNTS,
)
def test_amounts_fit_in_five_characters(value, text):
    assert amount(value) == text


def test_a_drop_reason_first_listed_counts_from_zero():
    """A counter cell is listed once it counted something: absent before, it was 0."""
    before = sample(0.0, [job(1)], counters({1: 0}, 0, 0, 0))
    now = counters({1: 0}, 0, 0, 0)
    now.switches[0].ingress_drops.add(name="index_20", index=20, packets=4)
    [sw] = build_view(before, sample(2.0, [job(1)], now), "c").switches
    assert sw.drops_per_s == 2 and sw.drops_per_s_by_reason == {"index_20": 2}


class Unavailable(grpc.RpcError, grpc.Call):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


class FlakyClient(TenantClient):
    """An admin's client whose controller is away for the second refresh; Ctrl-C at the
    fourth."""

    def __init__(self):
        super().__init__()
        self.refreshes = 0

    def status(self):
        self.refreshes += 1
        if self.refreshes == 2:
            raise Unavailable()
        if self.refreshes == 4:
            raise KeyboardInterrupt
        return STATUS

    def counters(self):
        return counters({7: 10 * self.refreshes}, 0, 0, 0)


def test_a_controller_lost_while_top_runs_is_a_line_and_rates_start_again(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(top.time, "sleep", lambda s: None)
    args = argparse.Namespace(controller="c:1", json=True, once=False, interval=1.0)
    assert top.run_top(args, FlakyClient()) == 0  # Ctrl-C: status 0
    first, lost, back = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["switches"][0]["jobs"][0]["packets"] == 10 and first["interval_s"] is None
    assert lost["error"] == "UNAVAILABLE: connection refused" and lost["controller"] == "c:1"
    assert back["switches"][0]["jobs"][0]["packets"] == 30 and back["interval_s"] is None
