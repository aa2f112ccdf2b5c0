"""The controller's gRPC service (homagg/api/jobs.proto) over a JobManager, and the server
that runs it. Every error leaves as a gRPC status with a message: ControllerError with its
own code, anything unexpected as INTERNAL (logged here with its traceback, never sent)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import logging
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from homagg.api import jobs_pb2, jobs_pb2_grpc
from homagg.api.credentials import Operator, authenticate, bearer
from homagg.api.errors import (
    Aborted,
    ControllerError,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)
from homagg.api.tls import server_credentials
from homagg.api.validation import check_timeout
from homagg.control.config import ControllerConfig, is_loopback
from homagg.control.counters import CounterValue, SwitchCounters
from homagg.control.job_record import GaveUp, Job, JobState
from homagg.control.jobs import JobManager
from homagg.control.metrics import ControllerMetrics
from homagg.control.quotas import Quotas
from homagg.control.store import Store
from homagg.control.tree import tree_rows
from homagg.control.views import controller_status, job_counters, pool_ranges, port_buffer_views
from homagg.control.waiting import WaitLimiter, client_host

log = logging.getLogger(__name__)
pb = jobs_pb2
MAX_QUEUED_PER_THREAD = 4  # the server's concurrency limit, per request thread


def version() -> str:
    """The installed homagg version."""
    try:
        return importlib.metadata.version("homagg")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _guard(method: Callable) -> Callable:
    @functools.wraps(method)
    def handler(self: ControllerService, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except ControllerError as exc:
            code, message = exc.status, str(exc)
        except Exception as exc:
            log.exception("%s failed", method.__name__)
            code, message = grpc.StatusCode.INTERNAL, f"internal error in {method.__name__}: {exc}"
        context.abort(code, message)

    return handler


def _operator_rpc(method: Callable) -> Callable:
    """An RPC only an operator may call: the caller is authenticated before `method` runs and
    passed to it (None when no operator credential is configured: the insecure mode). Every
    role may call it; `method` limits a tenant to its own jobs."""

    @functools.wraps(method)
    def handler(self: ControllerService, request: Any, context: grpc.ServicerContext) -> Any:
        op = self.operator(context, method.__name__)
        return method(self, request, context, op)

    return _guard(handler)


def _admin_rpc(method: Callable) -> Callable:
    """An operator RPC about the whole controller (switches, pools): admins only,
    PERMISSION_DENIED for a tenant's credential."""

    @functools.wraps(method)
    def handler(self: ControllerService, request: Any, context: grpc.ServicerContext) -> Any:
        op = self.operator(context, method.__name__)
        if op is not None and not op.admin:
            raise PermissionDenied(
                f"{method.__name__} is an admin call and the credential {op.name!r} is a "
                f"tenant's (role {op.role!r}: it creates jobs, lists and releases its own)"
            )
        return method(self, request, context, op)

    return _guard(handler)


def job_info(m: JobManager, job: Job) -> Any:
    """A Job as the JobInfo message."""
    info = pb.JobInfo(
        job_id=job.job_id,
        name=job.name,
        state=job.state.value,
        switch=job.switch or "",
        world_size=job.world_size,
        joined=len(job.workers),
        codec=job.codec,
        pool_base=job.pool_base or 0,
        pool_size=job.pool_size,
        created=job.created,
        ended=job.ended or 0.0,
        end_reason=job.end_reason,
        gave_ups=job.gave_ups,
    )
    for name, role, base, uplink_rank, ranks in tree_rows(job):
        info.tree.add(switch=name, role=role, pool_base=base, uplink_rank=uplink_rank, ranks=ranks)
    for w in sorted(job.workers.values(), key=lambda w: w.rank):
        info.workers.add(
            rank=w.rank,
            mac=w.mac,
            ip=w.ip,
            udp_port=w.udp_port,
            switch_port=w.switch_port,
            left=w.left,
            lease_remaining_s=-1.0 if job.ended else m.lease_remaining(w),
            switch=w.switch,
        )
    return info


def _values(values: list[CounterValue]) -> list[Any]:
    return [
        pb.CounterValue(name=v.name, index=v.index, packets=v.packets, bytes=v.bytes)
        for v in values
    ]


def switch_counters(c: SwitchCounters) -> Any:
    """SwitchCounters as its message."""
    msg = pb.SwitchCounters(
        switch=c.switch,
        error=c.error,
        ingress_drops=_values(c.ingress_drops),
        egress_drops=_values(c.egress_drops),
        events=_values(c.events),
    )
    for j in c.jobs:
        msg.jobs.add(
            job_id=j.job_id,
            name=j.name,
            packets=j.packets,
            bytes=j.bytes,
            workers=[
                pb.WorkerCounters(rank=w.rank, packets=w.packets, bytes=w.bytes) for w in j.workers
            ],
        )
    return msg


def tenant_view(c: SwitchCounters, owns: Callable[[int], bool]) -> SwitchCounters:
    """What a tenant reads of a switch's counters: its own jobs only, without the
    switch-wide drops and events, which sum every tenant's traffic."""
    return SwitchCounters(c.switch, c.error, jobs=[j for j in c.jobs if owns(j.job_id)])


class ControllerService(jobs_pb2_grpc.ControllerServicer):
    """Translates the RPCs of jobs.proto into JobManager calls."""

    def __init__(self, manager: JobManager, listen: str) -> None:
        self.m = manager
        self.listen = listen
        cfg = manager.config
        self.waits = WaitLimiter(cfg.wait_ready_limit, cfg.wait_ready_per_client, manager.wake)
        self.quotas = Quotas(manager)

    def operator(self, context: grpc.ServicerContext, rpc: str) -> Operator | None:
        """The operator presenting a valid credential; UNAUTHENTICATED otherwise. Every call
        passes when no operator is configured (insecure mode, warned about at start)."""
        operators = self.m.config.operators
        if not operators:
            return None
        token = bearer(context.invocation_metadata())
        if token is None:
            raise Unauthenticated(
                f"{rpc} is an operator call and needs an operator credential "
                "('authorization: Bearer TOKEN' metadata; aggctl reads it from "
                "--credential-file, $HOMAGG_OPERATOR_TOKEN_FILE or $HOMAGG_OPERATOR_TOKEN)"
            )
        op = authenticate(operators, token)
        if op is None:
            raise Unauthenticated(
                f"{rpc}: the operator credential is not one this controller knows"
            )
        return op

    @_operator_rpc
    def CreateJob(self, request: Any, context: grpc.ServicerContext, op: Operator | None) -> Any:
        pool_size = self.quotas.pool_size(request.pool_size)
        with self.quotas.lock:  # the check and the creation are one step per creation
            self.quotas.admit(op, pool_size)
            job, token = self.m.create(
                request.name,
                request.world_size,
                request.codec,
                pool_size,
                request.switch,
                op.name if op is not None else None,
            )
            self.quotas.record(job, op)
        if op is not None:
            log.info("job %d (%s) created by operator %s", job.job_id, job.name, op.name)
        cfg = self.m.config
        return pb.CreateJobResponse(
            job_id=job.job_id,
            token=token,
            switch=job.switch or "",
            pool_size=job.pool_size,
            heartbeat_interval_s=cfg.heartbeat_interval,
            lease_s=cfg.lease,
        )

    @_guard
    def JoinJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        job = self.m.join(
            request.job_id,
            request.token,
            request.rank,
            request.mac,
            request.ip,
            request.udp_port,
            request.switch_port if request.HasField("switch_port") else None,
        )
        cfg = self.m.config
        return pb.JoinJobResponse(
            joined=len(job.workers),
            world_size=job.world_size,
            ready=job.installed,
            heartbeat_interval_s=cfg.heartbeat_interval,
            lease_s=cfg.lease,
        )

    @_guard
    def WaitReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        timeout = check_timeout(request.timeout_s)
        remaining = context.time_remaining()
        if remaining is not None and 0 < remaining - 0.2 < timeout:
            timeout = (
                remaining - 0.2
            )  # answer DEADLINE_EXCEEDED ourselves, naming the missing ranks
        job_id, token, rank = request.job_id, request.token, request.rank
        state, _ = self.m.heartbeat(job_id, token, rank)  # authorized before it may park
        if state is JobState.READY:  # answered at once, parking nothing: no limit applies
            with contextlib.suppress(ControllerError):  # unless the switch was lost just now
                a = self.m.wait_ready(job_id, token, rank, timeout, lambda: False)
                return pb.Assignment(**dataclasses.asdict(a))
        owner = self.quotas.wait_owner(job_id)
        with self.waits.admit(job_id, rank, client_host(context.peer()), owner) as ticket:
            # a client that goes away frees its thread now, not at the next wake-up
            context.add_callback(lambda: None if ticket.done else self.m.wake())
            try:
                a = self.m.wait_ready(
                    job_id, token, rank, timeout, lambda: context.is_active() and not ticket.leaving
                )
            except ControllerError:
                if ticket.superseded:
                    raise Aborted(
                        f"superseded by a newer WaitReady of rank {rank} of job {job_id}"
                    ) from None
                if ticket.evicted:
                    raise ResourceExhausted(
                        f"this WaitReady gave its place to another job owner's: {owner} had "
                        "more than its fair share of the calls waiting "
                        f"(controller.{ticket.evicted}); retry later"
                    ) from None
                raise
        return pb.Assignment(**dataclasses.asdict(a))

    @_guard
    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        rank = request.rank
        report = GaveUp.from_message(request.gave_up, rank) if request.HasField("gave_up") else None
        state, told = self.m.heartbeat(request.job_id, request.token, rank, report)
        answer = pb.HeartbeatResponse(state=state.value, lease_s=self.m.config.lease)
        if told is not None:
            answer.gave_up.CopyFrom(pb.GaveUp(rank=told.rank, chunk=told.chunk, reason=told.reason))
        return answer

    @_guard
    def LeaveJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.LeaveJobResponse(
            job_ended=self.m.leave(request.job_id, request.token, request.rank)
        )

    @_admin_rpc
    def Status(self, request: Any, context: grpc.ServicerContext, op: Operator | None) -> Any:
        st = controller_status(self.m)
        return pb.StatusResponse(
            version=version(),
            uptime_s=time.time() - st.started,
            database=st.database,
            listen=self.listen,
            active_jobs=st.active_jobs,
            switches=[
                pb.SwitchStatus(
                    name=s.name,
                    address=s.address,
                    device_id=s.device_id,
                    connected=s.connected,
                    last_error=s.last_error,
                    connects=s.connects,
                    pipeline_pushes=s.pipeline_pushes,
                    slots_total=s.slots_total,
                    slots_used=s.slots_used,
                    jobs=s.jobs,
                    hosts=s.hosts,
                    mac=s.mac,
                    service_ip=s.service_ip,
                    role=s.role,
                    parent=s.parent,
                )
                for s in st.switches
            ],
        )

    @_operator_rpc
    def ListJobs(self, request: Any, context: grpc.ServicerContext, op: Operator | None) -> Any:
        jobs = [j for j in self.m.list_jobs(request.include_ended) if self.quotas.owns(op, j)]
        with self.m.lock:
            return pb.ListJobsResponse(jobs=[job_info(self.m, j) for j in jobs])

    @_admin_rpc
    def ListPools(self, request: Any, context: grpc.ServicerContext, op: Operator | None) -> Any:
        return pb.ListPoolsResponse(
            ranges=[
                pb.PoolRange(
                    switch=r.switch, base=r.base, size=r.size, job_id=r.job_id, job_name=r.job_name
                )
                for r in pool_ranges(self.m, request.switch)
            ],
            ports=[
                pb.PortBuffer(
                    switch=b.switch,
                    port=b.port,
                    buffer=b.buffer,
                    used=b.used,
                    headroom=b.headroom,
                    jobs=b.jobs,
                )
                for b in port_buffer_views(self.m, request.switch)
            ],
        )

    @_operator_rpc
    def GetCounters(self, request: Any, context: grpc.ServicerContext, op: Operator | None) -> Any:
        if op is not None and request.job_id and not self.quotas.owns(op, request.job_id):
            raise PermissionDenied(
                f"job {request.job_id} was not created with the credential {op.name!r} "
                "(a tenant reads the counters of its own jobs only)"
            )
        found = job_counters(self.m, request.switch, request.job_id)
        if op is not None and not op.admin:
            found = [tenant_view(c, lambda j: self.quotas.owns(op, j)) for c in found]
        return pb.GetCountersResponse(switches=[switch_counters(c) for c in found])

    @_operator_rpc
    def ReleaseJob(self, request: Any, context: grpc.ServicerContext, op: Operator | None) -> Any:
        if op is not None and not self.quotas.owns(op, request.job_id):
            raise PermissionDenied(
                f"job {request.job_id} was not created with the credential {op.name!r} "
                "(a tenant releases its own jobs only)"
            )
        job = self.m.release(request.job_id)
        if op is not None:
            log.info("job %d released by operator %s", job.job_id, op.name)
        with self.m.lock:
            return pb.ReleaseJobResponse(job=job_info(self.m, job))


class ControllerServer:
    """The controller: its JobManager (switch supervisors, leases) served over gRPC."""

    def __init__(
        self,
        config: ControllerConfig,
        fresh_database: bool = False,
        remove_unknown_jobs: bool = False,
        **manager_options: Any,
    ) -> None:
        """`fresh_database`: start with no jobs (an existing file is kept aside); with it or
        `remove_unknown_jobs`, jobs a switch holds that the database does not know are
        removed, else the controller refuses to manage the switch (`refusal`, `refused`)."""
        self.config = config
        self.store = Store(config.database, fresh=fresh_database)
        try:
            self.manager = JobManager(
                config,
                self.store,
                remove_unknown_jobs=fresh_database or remove_unknown_jobs,
                **manager_options,
            )
        except BaseException:
            self.store.close()
            raise
        self._server: grpc.Server | None = None
        self.port = 0
        # Prometheus metrics, when controller.metrics_listen is set (its URL once started)
        self.metrics = ControllerMetrics(self.manager) if config.metrics_listen else None
        self.metrics_url = ""

    def start(self) -> int:
        """Start the switch supervisors and serve on config.listen; returns the bound port."""
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.config.rpc_threads, thread_name_prefix="rpc"
            ),
            # beyond this many calls in progress or queued, gRPC answers RESOURCE_EXHAUSTED
            # ("Concurrent RPC limit exceeded") instead of queueing without bound
            maximum_concurrent_rpcs=self.config.rpc_threads * MAX_QUEUED_PER_THREAD,
            interceptors=[self.metrics.rpcs] if self.metrics is not None else None,
        )
        try:
            port = self._add_port(server)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {self.config.listen}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        host = self.config.listen.rpartition(":")[0]
        self.service = ControllerService(self.manager, f"{host}:{port}")
        jobs_pb2_grpc.add_ControllerServicer_to_server(self.service, server)
        self.manager.start()
        server.start()
        self._server, self.port = server, port
        if self.metrics is not None:
            cfg = self.config
            self.metrics_url = self.metrics.start(cfg.metrics_listen, cfg.metrics_non_loopback)
        log.info(
            "controller listening on %s:%d (database %s, %d switch(es))",
            host,
            port,
            self.store.path,
            len(self.config.switches),
        )
        return port

    def _add_port(self, server: grpc.Server) -> int:
        cfg = self.config
        secured = cfg.operators and cfg.tls_cert is not None
        if not secured and not is_loopback(cfg.listen):
            log.warning(
                "INSECURE: %s is not a loopback address: every host that reaches it can use "
                "what follows",
                cfg.listen,
            )
        if not cfg.operators:
            log.warning(
                "INSECURE: no [[operator]] configured: every operator call and CreateJob is "
                "open to anyone who reaches %s",
                cfg.listen,
            )
        if cfg.tls_cert is not None and cfg.tls_key is not None:
            return server.add_secure_port(cfg.listen, server_credentials(cfg.tls_cert, cfg.tls_key))
        log.warning(
            "INSECURE: the job API on %s is plaintext (no controller.tls_cert/tls_key): "
            "tokens cross the network readable",
            cfg.listen,
        )
        return server.add_insecure_port(cfg.listen)

    @property
    def refusal(self) -> str:
        """Why the controller must stop ("" while nothing is wrong): a switch holds jobs the
        database does not know (homagg/control/restore.py)."""
        return self.manager.refusal

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving, then the supervisors; the switches keep every entry."""
        if self.metrics is not None:
            self.metrics.stop()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        self.manager.stop()
        self.store.close()
