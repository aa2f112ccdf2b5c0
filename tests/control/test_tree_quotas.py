"""A tenant's max_slots quota counts a tree job's pool on every switch of its tree (its
leaves and their parent: docs/controller.md, Quotas): at creation against what its jobs
hold on all switches, and when a join spreads a job to a tree (more switches, more slots).
The job manager with switches that are never reached, and the Quotas the service uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from ctl_helpers import tree_config_dict

from homagg.api.errors import ResourceExhausted
from homagg.api.validation import hash_token
from homagg.control.config import parse_config
from homagg.control.jobs import JobManager
from homagg.control.quotas import Quotas, slots_held
from homagg.control.store import Store
from homagg.control.views import pool_ranges
from homagg.lab.addresses import host_entry

ADDRESSES = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")  # never reached


def quotas(tmp_path: Path, max_slots: int) -> Quotas:
    """The tree (spine over leaf1, leaf2) and the tenant 'carol' with `max_slots`."""
    doc = tree_config_dict(ADDRESSES, tmp_path)
    doc["operator"] = [
        {"name": "carol", "token_sha256": hash_token("carol-token"), "max_slots": max_slots}
    ]
    m = JobManager(parse_config(doc, tmp_path), Store(tmp_path / "controller.db"))
    with m.lock:
        for name in m.switches:
            m.switch_synced(name, [])
    return Quotas(m)


def create(q: Quotas, pool: int, name: str = "job"):
    op = q.m.config.operators[0]
    with q.lock:
        q.admit(op, pool)
        job, token = q.m.create(name, 2, "dense", pool, "", op.name)
        q.record(job, op)
    return job, token


def join(q: Quotas, job, token: str, rank: int, leaf: int) -> None:
    host = host_entry(rank // 2, leaf)
    q.m.join(job.job_id, token, rank, host["mac"], host["ip"], 41000 + rank)


def test_a_tree_job_counts_its_pool_on_each_of_its_three_switches(tmp_path: Path):
    q = quotas(tmp_path, max_slots=100)
    job, token = create(q, 16)
    assert slots_held(job) == 16  # not placed yet: what it asked for
    join(q, job, token, 0, leaf=1)
    join(q, job, token, 1, leaf=2)  # a sibling leaf: the job becomes a tree
    assert (job.switch, sorted(job.leaves)) == ("spine", ["leaf1", "leaf2"])
    assert slots_held(job) == 48
    with pytest.raises(ResourceExhausted, match="its jobs hold 48 slot"):
        create(q, 53, "more")  # 48 + 53 > 100
    create(q, 52, "fits")  # 48 + 52 = 100


def test_a_join_that_would_spread_a_job_past_the_quota_is_refused_and_undone(tmp_path: Path):
    q = quotas(tmp_path, max_slots=40)
    job, token = create(q, 16)
    join(q, job, token, 0, leaf=1)
    with pytest.raises(ResourceExhausted, match="would take 32 more on another switch"):
        join(q, job, token, 1, leaf=2)  # 16 on leaf1 + 32 on spine and leaf2 > 40
    assert (job.switch, job.leaves, sorted(job.workers)) == ("leaf1", {}, [0])  # as before
    held = {(r.switch, r.job_id) for r in pool_ranges(q.m) if r.job_id}
    assert held == {("leaf1", job.job_id)}  # no pool left behind on spine or leaf2
    join(q, job, token, 1, leaf=1)  # its other rank on the same leaf: flat, within quota
    assert job.complete and slots_held(job) == 16


def test_no_quota_and_jobs_without_an_operator_never_refuse_growth(tmp_path: Path):
    q = quotas(tmp_path, max_slots=0)  # 0: no limit
    job, token = create(q, 2048)
    join(q, job, token, 0, leaf=1)
    join(q, job, token, 1, leaf=2)
    assert slots_held(job) == 3 * 2048
    anon, anon_token = q.m.create("anon", 2, "dense", 64)  # insecure mode: no creator
    for rank, leaf in ((0, 1), (1, 2)):
        host = host_entry(1, leaf)
        q.m.join(anon.job_id, anon_token, rank, host["mac"], host["ip"], 42000 + rank)
    assert slots_held(anon) == 3 * 64
