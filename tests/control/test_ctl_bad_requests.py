"""Every malformed or unauthorized request gets its documented status and changes nothing:
neither the controller's view (jobs, ranks, pools) nor what the switch holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from ctl_helpers import (
    HOSTS,
    TARGETS,
    Env,
    bad_request_env,
    rpc_code,
)

from homagg.api import jobs_pb2
from homagg.api.errors import InvalidArgument
from homagg.api.validation import check_ip

C = grpc.StatusCode
H0, H1, H2 = HOSTS[0], HOSTS[1], HOSTS[2]


@pytest.fixture(scope="module", params=TARGETS)
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with bad_request_env(request.param, tmp_path_factory.mktemp("bad")) as e:
        yield e


def create(**kw: Any) -> Any:
    args = dict(name="j", world_size=2, codec="dense", pool_size=0) | kw
    return lambda e: e.c.create_job(**args)


def join(job: str = "open", token: str | None = None, job_id: int | None = None, **kw: Any) -> Any:
    def call(e: Env) -> Any:
        j = getattr(e, job)
        args = (
            dict(rank=1, mac=H1["mac"], ip=H1["ip"], udp_port=41001, switch_port=H1["switch_port"])
            | kw
        )
        return e.c.join(j.job_id if job_id is None else job_id, token or j.token, **args)

    return call


CASES = {
    "create/world_size 0": (create(world_size=0), C.INVALID_ARGUMENT, "world_size"),
    "create/world_size 33": (create(world_size=33), C.INVALID_ARGUMENT, "world_size"),
    "create/pool_size too big": (create(pool_size=4097), C.INVALID_ARGUMENT, "pool_size"),
    "create/bad codec": (create(codec="two words"), C.INVALID_ARGUMENT, "codec"),
    "create/empty name": (create(name=""), C.INVALID_ARGUMENT, "name"),
    "create/unknown switch": (create(switch="s9"), C.INVALID_ARGUMENT, "s9"),
    "join/no such job": (join(job_id=999), C.NOT_FOUND, "no job 999"),
    "join/job 0": (join(job_id=0), C.NOT_FOUND, "no job 0"),
    "join/wrong token": (join(token="not-the-token"), C.UNAUTHENTICATED, "wrong token"),
    "join/ended job, wrong token": (join("gone", token="x"), C.UNAUTHENTICATED, "wrong token"),
    "join/ended job": (join("gone", rank=0), C.FAILED_PRECONDITION, "released by the operator"),
    "join/rank outside world": (join(rank=2), C.INVALID_ARGUMENT, "rank"),
    "join/rank beyond 31": (join(rank=40), C.INVALID_ARGUMENT, "rank"),
    "join/duplicate rank": (join(rank=0), C.ALREADY_EXISTS, "rank 0"),
    "join/same endpoint as rank 0": (
        join(ip=H0["ip"], mac=H0["mac"], switch_port=H0["switch_port"], udp_port=41000),
        C.ALREADY_EXISTS,
        "already receives",
    ),
    "join/endpoint of another running job": (
        join(ip=H2["ip"], mac=H2["mac"], switch_port=H2["switch_port"], udp_port=41000),
        C.ALREADY_EXISTS,
        "used by rank 0 of job 2 (full) on switch s1",
    ),
    "join/rank of a ready job": (join("full", rank=0), C.ALREADY_EXISTS, "rank 0"),
    "join/bad mac": (join(mac="02:00:00:00:01"), C.INVALID_ARGUMENT, "mac"),
    "join/bad ip": (join(ip="10.0.0"), C.INVALID_ARGUMENT, "ip"),
    "join/multicast ip": (join(ip="224.0.0.1"), C.INVALID_ARGUMENT, "ip"),
    "join/udp port 0": (join(udp_port=0), C.INVALID_ARGUMENT, "udp_port"),
    "join/udp port 70000": (join(udp_port=70000), C.INVALID_ARGUMENT, "udp_port"),
    "join/switch port 600": (join(switch_port=600), C.INVALID_ARGUMENT, "switch_port"),
    "join/port contradicts topology": (join(switch_port=3), C.INVALID_ARGUMENT, "per the topology"),
    "join/mac contradicts topology": (
        join(mac="02:00:00:00:99:99"),
        C.INVALID_ARGUMENT,
        "per the topology",
    ),
    "wait/rank not joined": (
        lambda e: e.c.wait_ready(e.open.job_id, e.open.token, 1, 1),
        C.FAILED_PRECONDITION,
        "has not joined",
    ),
    "wait/timeout too long": (
        lambda e: e.c.wait_ready(e.open.job_id, e.open.token, 0, 1000),
        C.INVALID_ARGUMENT,
        "timeout_s",
    ),
    "wait/negative timeout": (
        lambda e: e.c.stub.WaitReady(
            jobs_pb2.WaitReadyRequest(
                job_id=e.open.job_id, token=e.open.token, rank=0, timeout_s=-1
            ),
            timeout=5,
        ),
        C.INVALID_ARGUMENT,
        "timeout_s",
    ),
    "wait/wrong token": (
        lambda e: e.c.wait_ready(e.open.job_id, "x", 0, 1),
        C.UNAUTHENTICATED,
        "wrong token",
    ),
    "heartbeat/no such job": (lambda e: e.c.heartbeat(4321, "x", 0), C.NOT_FOUND, "no job"),
    "heartbeat/rank not joined": (
        lambda e: e.c.heartbeat(e.open.job_id, e.open.token, 1),
        C.FAILED_PRECONDITION,
        "has not joined",
    ),
    "heartbeat/ended job": (
        lambda e: e.c.heartbeat(e.gone.job_id, e.gone.token, 0),
        C.FAILED_PRECONDITION,
        "has ended",
    ),
    "leave/rank not joined": (
        lambda e: e.c.leave(e.open.job_id, e.open.token, 1),
        C.FAILED_PRECONDITION,
        "has not joined",
    ),
    "leave/wrong token": (
        lambda e: e.c.leave(e.full.job_id, "x", 0),
        C.UNAUTHENTICATED,
        "wrong token",
    ),
    "release/no such job": (lambda e: e.c.release(777), C.NOT_FOUND, "no job 777"),
    "pools/unknown switch": (lambda e: e.c.list_pools("nope"), C.INVALID_ARGUMENT, "nope"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rejected_without_side_effects(env: Env, case: str) -> None:
    call, code, fragment = CASES[case]
    before = env.snapshot()
    got, details = rpc_code(lambda: call(env))
    assert got == code, details
    assert fragment in details
    assert "Traceback" not in details
    assert env.snapshot() == before


def test_retried_join_is_idempotent(env: Env) -> None:
    before = env.snapshot()
    again = env.c.join(
        env.open.job_id, env.open.token, 0, H0["mac"], H0["ip"], 41000, H0["switch_port"]
    )
    assert again.joined == 1 and not again.ready
    assert env.snapshot() == before


@pytest.mark.parametrize(
    "ip, unicast",
    [
        ("0.0.0.0", False),
        ("255.255.255.255", False),
        ("224.0.0.0", False),
        ("239.255.255.255", False),
        ("0.0.0.1", True),
        ("223.255.255.255", True),
        ("240.0.0.1", True),
        ("255.255.255.254", True),
    ],
)
def test_ip_check_at_the_edges_of_unicast(ip: str, unicast: bool) -> None:
    if unicast:
        assert check_ip(ip) == ip
    else:
        with pytest.raises(InvalidArgument, match="not a unicast host address"):
            check_ip(ip)
