"""Roles of the operator credentials (docs/controller.md, Security): an admin makes every call
on every job; a tenant creates jobs and lists and releases only the jobs it created (so
only its own workers' addresses) and reads the counters of its own jobs only,
PERMISSION_DENIED for the rest; a tenant's quotas default
to TENANT_MAX_JOBS and TENANT_MAX_SLOTS, an admin's to none; ownership survives a restart."""

from __future__ import annotations

import json

import grpc
import pytest
from ctl_helpers import HOSTS, config_dict, join_all, rpc_code

from homagg.api.client import ControllerClient
from homagg.api.credentials import TENANT_MAX_JOBS, TENANT_MAX_SLOTS, hash_token
from homagg.control.cli import main
from homagg.control.config import ConfigError, parse_config
from homagg.environment import CA_FILE_ENV, OPERATOR_TOKEN_ENV, OPERATOR_TOKEN_FILE_ENV

ROOT, CAROL, DAVE = "root-token", "-carol-token", "dave-token"
DENIED = grpc.StatusCode.PERMISSION_DENIED
ADMIN_CALLS = {
    "Status": lambda c: c.status(),
    "ListPools": lambda c: c.list_pools(),
}


def roles_config(address: str, tmp_path, **carol):
    """An admin (root) and two tenants (carol, with `carol`'s keys; dave) on one switch."""
    doc = config_dict([("s1", address, HOSTS)], tmp_path)
    doc["operator"] = [
        {"name": "root", "token_sha256": hash_token(ROOT), "role": "admin"},
        {"name": "carol", "token_sha256": hash_token(CAROL), **carol},
        {"name": "dave", "token_sha256": hash_token(DAVE), "role": "tenant"},
    ]
    return parse_config(doc, tmp_path)


def client(ctl, token: str) -> ControllerClient:
    return ControllerClient(ctl.address, 5.0, operator_token=token, insecure=True)


def test_roles_and_their_default_quotas_in_the_configuration(tmp_path):
    root, carol, dave = roles_config("127.0.0.1:1", tmp_path).operators
    assert root.admin and (root.max_jobs, root.max_slots) == (0, 0)
    assert not carol.admin and carol.role == "tenant"  # the role when none is given
    assert (carol.max_jobs, carol.max_slots) == (TENANT_MAX_JOBS, TENANT_MAX_SLOTS) == (8, 1024)
    assert not dave.admin
    unlimited = roles_config("127.0.0.1:1", tmp_path, max_jobs=0, max_slots=0).operators[1]
    assert (unlimited.max_jobs, unlimited.max_slots) == (0, 0)  # 0 given: no limit
    with pytest.raises(ConfigError, match=r"operator\[1\].role: expected one of admin, tenant"):
        roles_config("127.0.0.1:1", tmp_path, role="owner")


def test_a_tenant_sees_and_releases_its_own_jobs_only(refswitch, tmp_path, start_controller):
    ctl = start_controller(roles_config(refswitch.address, tmp_path), operator_token=ROOT)
    with client(ctl, CAROL) as carol, client(ctl, DAVE) as dave:
        mine = carol.create_job("carol-1", 1, "dense", pool_size=4)
        theirs = dave.create_job("dave-1", 1, "dense", pool_size=4)
        join_all(carol, mine, HOSTS[:1])
        join_all(dave, theirs, HOSTS[1:2])
        for rpc, call in ADMIN_CALLS.items():
            code, details = rpc_code(lambda: call(carol))  # noqa: B023
            assert code == DENIED and f"{rpc} is an admin call" in details
            assert "'carol'" in details
        [listed] = carol.list_jobs(True).jobs
        assert listed.job_id == mine.job_id and listed.workers[0].ip == HOSTS[0]["ip"]
        assert HOSTS[1]["ip"] not in str(carol.list_jobs(True))  # never another's workers
        for job_id in (theirs.job_id, 999):  # another tenant's job, and none at all
            code, details = rpc_code(lambda: carol.release(job_id))  # noqa: B023
            assert code == DENIED and "a tenant releases its own jobs only" in details
        assert [j.state for j in dave.list_jobs().jobs] == ["ready"]
        assert carol.release(mine.job_id).job.state == "ended"
        [ended] = carol.list_jobs(True).jobs  # its ended job stays visible to it
        assert ended.job_id == mine.job_id and ended.state == "ended"
        # the admin sees and operates everything
        assert {j.job_id for j in ctl.client.list_jobs(True).jobs} == {mine.job_id, theirs.job_id}
        assert ctl.client.status().active_jobs == 1 and ctl.client.list_pools().ranges
        assert ctl.client.release(theirs.job_id).job.state == "ended"
    ctl.stop()
    again = start_controller(roles_config(refswitch.address, tmp_path), operator_token=ROOT)
    with client(again, DAVE) as dave:  # who created what is kept in the database
        assert [j.job_id for j in dave.list_jobs(True).jobs] == [theirs.job_id]


def test_a_tenants_default_quotas_bound_what_it_can_take(refswitch, tmp_path, start_controller):
    ctl = start_controller(roles_config(refswitch.address, tmp_path), operator_token=ROOT)
    with client(ctl, CAROL) as carol:
        code, details = rpc_code(lambda: carol.create_job("big", 1, "dense", pool_size=1025))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota max_slots of operator 'carol' is 1024" in details
        for i in range(TENANT_MAX_JOBS):
            carol.create_job(f"c{i}", 1, "dense", pool_size=1)
        code, details = rpc_code(lambda: carol.create_job("one-more", 1, "dense", pool_size=1))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota max_jobs of operator 'carol' is 8" in details
    # the admin has no quota unless configured: it can take the rest of the switch
    assert ctl.client.create_job("root", 1, "dense", pool_size=4096 - 8).pool_size == 4088


def test_aggctl_with_a_tenants_credential(
    refswitch, tmp_path, start_controller, capsys, monkeypatch
):
    ctl = start_controller(roles_config(refswitch.address, tmp_path), operator_token=ROOT)
    for name in (CA_FILE_ENV, OPERATOR_TOKEN_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(OPERATOR_TOKEN_ENV, CAROL)
    with client(ctl, DAVE) as dave:
        dave.create_job("dave-1", 1, "dense", pool_size=4)
    base = ["--insecure", "--controller", ctl.address]
    capsys.readouterr()
    assert main([*base, "job", "create", "mine", "--world-size", "1", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert main([*base, "jobs", "--json"]) == 0
    assert [j["name"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["mine"]
    assert main([*base, "status"]) == 1
    assert "PERMISSION_DENIED: Status is an admin call" in capsys.readouterr().err
    assert main([*base, "release", str(made["job_id"])]) == 0


def test_a_tenant_reads_the_counters_of_its_own_jobs_only(
    refswitch, tmp_path, start_controller, capsys, monkeypatch
):
    ctl = start_controller(roles_config(refswitch.address, tmp_path), operator_token=ROOT)
    with client(ctl, CAROL) as carol, client(ctl, DAVE) as dave:
        mine = carol.create_job("carol-1", 1, "dense", pool_size=4)
        theirs = dave.create_job("dave-secret", 2, "dense", pool_size=4)
        join_all(carol, mine, HOSTS[:1])
        join_all(dave, theirs, HOSTS[1:3])
        [sw] = carol.counters().switches
        assert [j.job_id for j in sw.jobs] == [mine.job_id] and sw.switch == "s1"
        assert not sw.ingress_drops and not sw.egress_drops and not sw.events  # every tenant's
        [sw] = carol.counters(job_id=mine.job_id).switches
        assert [(j.name, [w.rank for w in j.workers]) for j in sw.jobs] == [("carol-1", [0])]
        for job_id in (theirs.job_id, 999):  # another tenant's job, and none at all
            code, details = rpc_code(lambda: carol.counters(job_id=job_id))  # noqa: B023
            assert code == DENIED and "reads the counters of its own jobs only" in details
        assert "dave-secret" not in str(carol.counters(switch="s1"))
        [sw] = ctl.client.counters().switches  # the admin: every job, the switch-wide counters
        assert [j.job_id for j in sw.jobs] == [mine.job_id, theirs.job_id] and sw.events
    for name in (CA_FILE_ENV, OPERATOR_TOKEN_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(OPERATOR_TOKEN_ENV, DAVE)
    capsys.readouterr()
    base = ["--insecure", "--controller", ctl.address]
    assert main([*base, "counters", "--json"]) == 0
    [sw] = json.loads(capsys.readouterr().out)["switches"]
    assert [j["name"] for j in sw["jobs"]] == ["dave-secret"]
    assert main([*base, "counters", "--job", str(mine.job_id)]) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err
