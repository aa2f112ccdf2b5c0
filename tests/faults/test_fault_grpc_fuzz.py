"""Randomized requests to the controller's gRPC service (seeded): random and huge strings,
control characters, numbers at and beyond every range (uint32 wrap-arounds of negative
values), wrong tokens, replayed and cross-job joins, undecodable request bytes. Every
answer is a documented status code (never INTERNAL or UNKNOWN) or a harmless success (an
idempotent replay, a heartbeat, a read); nothing changes: jobs, ranks, pools and the
switch's entries are the same afterwards, and the service still answers Status.

tests/control/test_ctl_bad_requests.py checks each documented refusal one by one; this
test throws many random combinations at the same service."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from ctl_helpers import (
    HOSTS,
    Env,
    bad_request_env,
)

from homagg.api import jobs_pb2

C = grpc.StatusCode
DOCUMENTED = {
    C.INVALID_ARGUMENT,
    C.NOT_FOUND,
    C.UNAUTHENTICATED,
    C.ALREADY_EXISTS,
    C.FAILED_PRECONDITION,
    C.RESOURCE_EXHAUSTED,
    C.DEADLINE_EXCEEDED,
    C.UNAVAILABLE,
}
REQUESTS = 600
SEED = 20261122
U32 = 2**32 - 1
H0, H1, H2 = HOSTS[0], HOSTS[1], HOSTS[2]
METHODS = [
    "CreateJob",
    "JoinJob",
    "WaitReady",
    "Heartbeat",
    "LeaveJob",
    "Status",
    "ListJobs",
    "ListPools",
    "GetCounters",
    "ReleaseJob",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with bad_request_env("refswitch", tmp_path_factory.mktemp("fuzz")) as e:
        yield e


class Fuzzer:
    """Random request fields; `bad_*` values are outside what validation accepts."""

    def __init__(self, rng: random.Random, env: Env) -> None:
        self.r, self.env = rng, env

    def string(self) -> str:
        r = self.r
        return r.choice(
            [
                "",
                " ",
                "x" * r.choice([65, 1000, 100_000]),
                "\x00",
                "a\nb",
                "\u202e\u0000",
                "é" * 40,
                "🙂",
                "".join(chr(r.randrange(0x20, 0x7F)) for _ in range(r.randrange(1, 70))),
                "".join(chr(r.randrange(1, 0xD7FF)) for _ in range(r.randrange(1, 30))),
                "02:00:00:00:01:01",
                "10.0.0.1",
                "s1",
                "dense",
                "-1",
                "4294967295",
                "NaN",
            ]
        )

    def number(self) -> int:
        return self.r.choice(
            [
                0,
                1,
                2,
                31,
                32,
                33,
                511,
                512,
                4096,
                4097,
                65535,
                65536,
                2**31 - 1,
                2**31,
                U32,
                U32 - 1,
                self.r.randrange(U32 + 1),
            ]
        )

    def bad_number(self, low: int, high: int) -> int:
        """Outside low..high, often a negative number as uint32 sees it."""
        options = [U32, U32 - 1, 2**31, high + 1, high + self.r.randrange(1, 1000)]
        if low > 0:
            options.append(0)
        return self.r.choice([v for v in options if not low <= v <= high])

    def token(self, job: Any) -> str:
        return self.r.choice(
            [
                job.token,
                job.token + "x",
                job.token[:-1],
                "",
                self.string(),
                self.env.full.token if job is not self.env.full else self.env.open.token,
            ]
        )

    def job_id(self) -> int:
        e = self.env
        return self.r.choice(
            [e.open.job_id, e.full.job_id, e.gone.job_id, 0, 999, 65535, 65536, U32]
        )

    def known(self, job_id: int) -> Any:
        return next((j for j in self.env.jobs.values() if j.job_id == job_id), None)

    # ---- one request per method; each must be refused or change nothing --------------
    def create(self) -> tuple[str, Any]:
        f = dict(name="n", world_size=2, codec="dense", pool_size=0, switch="")
        corrupt = self.r.sample(
            ["name", "world_size", "codec", "pool_size", "switch"], self.r.randrange(1, 4)
        )
        for field in corrupt:
            f[field] = {
                "name": lambda: self.r.choice(["", "x" * 65, "a\nb", "\x00", "tab\there"]),
                "world_size": lambda: self.bad_number(1, 32),
                "codec": lambda: self.r.choice(["", "two words", "x" * 65, "é", "a/b", "\x00"]),
                "pool_size": lambda: self.bad_number(0, 4096),
                "switch": lambda: self.r.choice(["s2", " ", "S1", "s1\x00", "x" * 1000]),
            }[field]()
        return "CreateJob", jobs_pb2.CreateJobRequest(**f)

    def join(self) -> tuple[str, Any]:
        e, r = self.env, self.r
        kind = r.randrange(4)
        if kind == 0:  # an exact replay of a join that happened: accepted, changes nothing
            job, fields = r.choice([(e.open, e.open_join), (e.full, e.full_join)])
            return "JoinJob", jobs_pb2.JoinJobRequest(job_id=job.job_id, token=job.token, **fields)
        if (
            kind == 1
        ):  # a replayed join carried to another job, with that job's id but its own token
            job, fields = r.choice([(e.open, e.open_join), (e.full, e.full_join)])
            other = r.choice([j for j in e.jobs.values() if j is not job])
            return "JoinJob", jobs_pb2.JoinJobRequest(
                job_id=other.job_id, token=job.token, **fields
            )
        job_id = self.job_id()
        job = self.known(job_id)
        token = self.token(job) if job is not None else self.string()
        f = dict(
            rank=r.choice([1, self.number()]),
            mac=r.choice([H1["mac"], self.string()]),
            ip=r.choice([H1["ip"], self.string()]),
            udp_port=r.choice([41001, self.number()]),
            switch_port=r.choice([H1["switch_port"], self.number()]),
        )
        if job is e.open and token == job.token:  # must not complete the open job: break a field
            field = r.choice(["rank", "mac", "ip", "udp_port", "switch_port"])
            f[field] = {
                "rank": lambda: r.choice([0, 2, U32]),
                "mac": lambda: r.choice(["", "zz", "ff:ff:ff:ff:ff:ff"]),
                "ip": lambda: r.choice(["", "10.0.0", "224.0.0.1", "255.255.255.255"]),
                "udp_port": lambda: r.choice([0, 65536, U32]),
                "switch_port": lambda: r.choice([3, 512, U32]),
            }[field]()
            if field == "rank" and f["rank"] == 0:
                f["udp_port"] = 41001  # another endpoint for an already joined rank
        return "JoinJob", jobs_pb2.JoinJobRequest(job_id=job_id, token=token, **f)

    def rank_call(self, method: str) -> tuple[str, Any]:
        r = self.r
        job_id = self.job_id()
        job = self.known(job_id)
        token = self.token(job) if job is not None else self.string()
        rank = r.choice([0, 1, 2, 31, 32, U32, self.number()])
        if (
            method == "LeaveJob"
            and job is not None
            and token == job.token
            and rank == 0
            and job is not self.env.gone
        ):
            token = token + "x"  # a real leave would change state
        if method == "WaitReady":
            timeout = r.choice(
                [-1.0, 301.0, 1e300, float("inf"), float("-inf"), float("nan"), -0.0001, 0.05]
            )
            if timeout == 0.05 and not (job is self.env.full and token == job.token and rank == 0):
                timeout = r.choice([0.05, -1.0])  # would wait for rank 1 of `open`: keep it short
            return method, jobs_pb2.WaitReadyRequest(
                job_id=job_id, token=token, rank=rank, timeout_s=timeout
            )
        cls = {"Heartbeat": jobs_pb2.HeartbeatRequest, "LeaveJob": jobs_pb2.LeaveJobRequest}[method]
        return method, cls(job_id=job_id, token=token, rank=rank)

    def operator(self, method: str) -> tuple[str, Any]:
        r = self.r
        if method == "ReleaseJob":  # never a live job
            return method, jobs_pb2.ReleaseJobRequest(
                job_id=r.choice([0, 999, 65535, U32, self.env.gone.job_id])
            )
        if method == "ListPools":
            return method, jobs_pb2.ListPoolsRequest(switch=r.choice(["", "s1", self.string()]))
        if method == "GetCounters":
            return method, jobs_pb2.GetCountersRequest(
                switch=r.choice(["", "s1", self.string()]), job_id=self.job_id()
            )
        if method == "ListJobs":
            return method, jobs_pb2.ListJobsRequest(include_ended=r.random() < 0.5)
        return method, jobs_pb2.StatusRequest()

    def request(self) -> tuple[str, Any]:
        method = self.r.choice(METHODS)
        if method == "CreateJob":
            return self.create()
        if method == "JoinJob":
            return self.join()
        if method in ("WaitReady", "Heartbeat", "LeaveJob"):
            return self.rank_call(method)
        return self.operator(method)


def call(env: Env, method: str, request: Any, timeout: float = 5.0) -> tuple[grpc.StatusCode, str]:
    try:
        getattr(env.c.stub, method)(request, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return C.OK, ""


@pytest.mark.timeout(120)
def test_random_requests_get_documented_codes_and_change_nothing(
    env: Env, fault_report: Callable
) -> None:
    rng = random.Random(SEED)
    fuzz = Fuzzer(rng, env)
    before = env.snapshot()
    seen: dict[str, dict[str, int]] = {}
    for i in range(REQUESTS):
        method, request = fuzz.request()
        code, details = call(env, method, request)
        seen.setdefault(method, {}).setdefault(code.name, 0)
        seen[method][code.name] += 1
        assert code in DOCUMENTED | {C.OK}, (
            f"request {i} {method}({request!r:.300}): {code.name} {details}"
        )
        assert "Traceback" not in details
        if code == C.OK:
            assert method in (
                "JoinJob",
                "Heartbeat",
                "WaitReady",
                "Status",
                "ListJobs",
                "ListPools",
                "GetCounters",
            ), f"request {i} {method} was accepted: {request!r:.300}"
        if method == "CreateJob":
            assert code == C.INVALID_ARGUMENT, f"request {i}: {code.name} {details}"
        if i % 100 == 99:
            assert env.snapshot() == before, f"state changed by one of requests {i - 99}..{i}"
    assert env.snapshot() == before
    assert env.c.status().active_jobs == 2
    fault_report(f"{REQUESTS} random requests: {seen}")


@pytest.mark.timeout(60)
def test_undecodable_request_bytes_leave_the_service_up(env: Env, fault_report: Callable) -> None:
    """Random bytes as the serialized request of every method (protobuf's parser may accept
    them as unknown fields or reject them; gRPC answers the latter before the service
    sees the call): nothing changes, the service keeps answering."""
    rng = random.Random(SEED + 1)
    channel = grpc.insecure_channel(env.ctl.address)
    before = env.snapshot()
    seen: dict[str, int] = {}
    for _i in range(200):
        method = rng.choice(
            ["JoinJob", "WaitReady", "Heartbeat", "LeaveJob", "ListPools"]
        )  # no ReleaseJob: it needs no token by design
        payload = rng.randbytes(rng.randrange(0, 200))
        stub = channel.unary_unary(
            f"/homagg.controller.v1.Controller/{method}",
            request_serializer=None,
            response_deserializer=None,
        )
        try:
            stub(payload, timeout=5)
            code, details = C.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        seen[code.name] = seen.get(code.name, 0) + 1
        # gRPC itself answers INTERNAL "Exception deserializing request!" for bytes protobuf
        # rejects; any other INTERNAL would be the service failing.
        assert code in DOCUMENTED | {C.OK} or (
            code == C.INTERNAL and "deserializ" in details.lower()
        ), f"{method}({payload!r}): {code.name} {details}"
    channel.close()
    assert env.snapshot() == before
    assert env.c.status().active_jobs == 2
    fault_report(f"200 undecodable requests: {seen}")
