"""A typed client of the controller's gRPC API (used by aggctl, the tests and workers).
Failures surface as grpc.RpcError with the status codes listed in docs/controller.md.
The channel is TLS, the controller's certificate verified against a CA (ca_file, else
$HOMAGG_CA_FILE), unless plaintext is chosen explicitly (insecure=True or $HOMAGG_INSECURE=1:
a controller started with --insecure; warned about once per process). With neither the client
is refused (TlsError saying what to set): no token is ever sent in the clear by default."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from homagg.api import jobs_pb2, jobs_pb2_grpc
from homagg.api.credentials import call_metadata
from homagg.api.tls import channel_credentials, client_ca, warn_plaintext
from homagg.control.job_record import GaveUp

pb = jobs_pb2

Release = Callable[[int], None]
"""Ends job `job_id` at the controller (raises grpc.RpcError when it refuses), e.g.
ControllerClient.release."""

DEFAULT_PORT = 50051  # the job API's TCP port, unless configured otherwise
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class ControllerClient:
    """One channel to a controller; `timeout` bounds every call except WaitReady's own wait.
    `ca_file`: verify the controller's TLS certificate against this CA (None: $HOMAGG_CA_FILE);
    `insecure`: plaintext, for a controller without TLS (also $HOMAGG_INSECURE=1);
    `operator_token`: the credential sent with CreateJob and the operator calls;
    `server_name`: the name the certificate must carry when it is not the dialed host.
    TlsError when the CA cannot be read, or when neither a CA nor plaintext is chosen."""

    def __init__(
        self,
        address: str = DEFAULT_LISTEN,
        timeout: float = 10.0,
        ca_file: Path | None = None,
        operator_token: str | None = None,
        server_name: str = "",
        insecure: bool = False,
    ) -> None:
        self.address = address
        self.timeout = timeout
        ca = client_ca(address, ca_file, insecure)
        self.secure = ca is not None
        self._auth = call_metadata(operator_token)
        if ca is None:
            warn_plaintext(address)
            self._channel = grpc.insecure_channel(address)
        else:
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
            self._channel = grpc.secure_channel(address, channel_credentials(ca), options)
        self.stub = jobs_pb2_grpc.ControllerStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- workers ----------------------------------------------------------------------

    def create_job(
        self, name: str, world_size: int, codec: str, pool_size: int = 0, switch: str = ""
    ) -> Any:
        """CreateJob -> CreateJobResponse (job_id, token, switch, pool_size, timing)."""
        return self.stub.CreateJob(
            pb.CreateJobRequest(
                name=name, world_size=world_size, codec=codec, pool_size=pool_size, switch=switch
            ),
            timeout=self.timeout,
            metadata=self._auth,
        )

    def join(
        self,
        job_id: int,
        token: str,
        rank: int,
        mac: str,
        ip: str,
        udp_port: int,
        switch_port: int | None = None,
    ) -> Any:
        """JoinJob -> JoinJobResponse (joined, world_size, ready); switch_port None lets the
        controller find it in its topology."""
        request = pb.JoinJobRequest(
            job_id=job_id, token=token, rank=rank, mac=mac, ip=ip, udp_port=udp_port
        )
        if switch_port is not None:
            request.switch_port = switch_port
        return self.stub.JoinJob(request, timeout=self.timeout)

    def wait_ready(self, job_id: int, token: str, rank: int, timeout_s: float = 30.0) -> Any:
        """WaitReady -> Assignment; DEADLINE_EXCEEDED when ranks are still missing after
        timeout_s."""
        return self.stub.WaitReady(
            pb.WaitReadyRequest(job_id=job_id, token=token, rank=rank, timeout_s=timeout_s),
            timeout=timeout_s + self.timeout,
        )

    def heartbeat(self, job_id: int, token: str, rank: int, gave_up: GaveUp | None = None) -> Any:
        """Heartbeat -> HeartbeatResponse (state, lease_s, the newest give-up of any rank);
        `gave_up`: this rank gave up a call (its rank is the request's)."""
        request = pb.HeartbeatRequest(job_id=job_id, token=token, rank=rank)
        if gave_up is not None:
            request.gave_up.CopyFrom(pb.GaveUp(chunk=gave_up.chunk, reason=gave_up.reason))
        return self.stub.Heartbeat(request, timeout=self.timeout)

    def leave(self, job_id: int, token: str, rank: int) -> Any:
        """LeaveJob -> LeaveJobResponse (job_ended)."""
        return self.stub.LeaveJob(
            pb.LeaveJobRequest(job_id=job_id, token=token, rank=rank), timeout=self.timeout
        )

    # -- operators --------------------------------------------------------------------

    def status(self) -> Any:
        """Status -> StatusResponse."""
        return self.stub.Status(pb.StatusRequest(), timeout=self.timeout, metadata=self._auth)

    def list_jobs(self, include_ended: bool = False) -> Any:
        """ListJobs -> ListJobsResponse."""
        return self.stub.ListJobs(
            pb.ListJobsRequest(include_ended=include_ended),
            timeout=self.timeout,
            metadata=self._auth,
        )

    def list_pools(self, switch: str = "") -> Any:
        """ListPools -> ListPoolsResponse."""
        return self.stub.ListPools(
            pb.ListPoolsRequest(switch=switch), timeout=self.timeout, metadata=self._auth
        )

    def counters(self, switch: str = "", job_id: int = 0) -> Any:
        """GetCounters -> GetCountersResponse."""
        return self.stub.GetCounters(
            pb.GetCountersRequest(switch=switch, job_id=job_id),
            timeout=self.timeout,
            metadata=self._auth,
        )

    def release(self, job_id: int) -> Any:
        """ReleaseJob -> ReleaseJobResponse."""
        return self.stub.ReleaseJob(
            pb.ReleaseJobRequest(job_id=job_id), timeout=self.timeout, metadata=self._auth
        )


def release_job(release: Release, job_id: int) -> str:
    """Release `job_id` through `release`: "" when the job is ended now (a job that already
    ended, e.g. when every rank left before, counts as released), else why not. For the
    launcher (homagg/worker/job/launch.py) and rank 0's job session
    (homagg/worker/job/session.py)."""
    try:
        release(job_id)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        if code == grpc.StatusCode.FAILED_PRECONDITION:  # "job N has already ended: ..."
            return ""
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        return f"{code.name if code else 'UNKNOWN'}: {details}"
    except Exception as exc:  # no credential, no TLS: the lease ends the job anyway
        return str(exc)
    return ""
