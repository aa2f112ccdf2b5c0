"""`attach(ddp_model)`: put an ordinary torchrun/DDP script on the switch with one added line.

Everything comes from the environment: the controller from HOMAGG_CONTROLLER (or the
`controller=` argument), rank and world size from the process group, the job either from
the launcher (HOMAGG_JOB_ID with HOMAGG_TOKEN_FILE or HOMAGG_TOKEN) or created by rank 0
with the operator credential of HOMAGG_OPERATOR_TOKEN_FILE or HOMAGG_OPERATOR_TOKEN and
shared through the process group (the token is never logged), the CA that signed the
controller's TLS certificate from HOMAGG_CA_FILE (without it: plaintext), this worker's IP,
interface and MAC from the route to the controller (or HOMAGG_IFACE when the switch is on
another interface), and its switch port from the
controller's topology. Whatever fails, every rank gets the same message and the model
trains over the process group instead (one warning), never hangs (docs/worker.md)."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from aggwire.constants import MAX_WORKERS_PER_JOB
from controller.credentials import (
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    SecretError,
    ca_file,
    job_token,
    operator_token,
)
from worker.agent import AgentConfig, AgentError, WorkerAgent, interface_mac, open_agent
from worker.codecs import CODECS, LANE_CODECS
from worker.ddp_hook import SwitchHookState, switch_allreduce_hook

log = logging.getLogger(__name__)

ENV_CONTROLLER = "HOMAGG_CONTROLLER"
ENV_JOB_ID = "HOMAGG_JOB_ID"
ENV_TOKEN = JOB_TOKEN_ENV
ENV_TOKEN_FILE = JOB_TOKEN_FILE_ENV
ENV_CODEC = "HOMAGG_CODEC"
ENV_IFACE = "HOMAGG_IFACE"  # the data-plane interface, when not the route to the controller
UDP_BASE_PORT = 41000  # rank r on a node uses UDP_BASE_PORT + LOCAL_RANK


@dataclass(frozen=True)
class JobTicket:
    """A job this process group uses: its id and token (secret), and whether rank 0 made it
    (then rank 0 releases it at exit)."""

    job_id: int
    token: str
    created_here: bool

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"JobTicket(job_id={self.job_id}, created_here={self.created_here})"


@dataclass(frozen=True)
class Route:
    """This host's side of the route to the controller."""

    ip: str
    iface: str
    mac: str


def route_to(address: str) -> Route:
    """The source IP, interface and MAC this host uses to reach `address` (host:port)."""
    host, _, port = address.rpartition(":")
    try:
        target = socket.getaddrinfo(host.strip("[]"), int(port or 0), socket.AF_INET)[0][4]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(target)  # no packet is sent: the kernel picks the route and source
            ip = s.getsockname()[0]
    except (OSError, ValueError) as exc:
        raise AgentError(f"no route to the controller {address}: {exc}") from exc
    iface = next((name for name, addr in _ipv4_addresses() if addr == ip), None)
    if iface is None:
        raise AgentError(f"no interface holds {ip}, the source address towards the controller")
    return Route(ip, iface, interface_mac(iface))


def route_of(iface: str) -> Route:
    """The first IPv4 address and the MAC of interface `iface`."""
    ip = next((addr for name, addr in _ipv4_addresses() if name == iface), None)
    if ip is None:
        raise AgentError(f"interface {iface!r} ({ENV_IFACE}) has no IPv4 address here")
    return Route(ip, iface, interface_mac(iface))


def _ipv4_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of this network namespace, from `ip -o -4 addr`."""
    try:
        out = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise AgentError(f"cannot list this host's addresses: {exc}") from exc
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3:
            found.append((fields[1].split("@")[0], fields[3].split("/")[0]))
    return found


def _token_from_env() -> str:
    try:
        return job_token() or ""
    except SecretError as exc:
        raise AgentError(f"the job token ({ENV_TOKEN_FILE}): {exc}") from exc


def _client(controller: str, timeout: float) -> Any:
    """A client of the controller with this process's CA and operator credential."""
    from controller.client import ControllerClient
    from controller.tls import TlsError

    try:
        return ControllerClient(controller, timeout, ca_file(), operator_token())
    except (SecretError, TlsError) as exc:
        raise AgentError(f"cannot reach the controller {controller} securely: {exc}") from exc


def _make_job(controller: str, world: int, codec: str, pool_size: int, name: str) -> JobTicket:
    """Rank 0's part: the launcher's job from the environment, or a new one."""
    if os.environ.get(ENV_JOB_ID):
        return JobTicket(int(os.environ[ENV_JOB_ID]), _token_from_env(), False)
    import grpc

    try:
        with _client(controller, 10.0) as client:
            made = client.create_job(name, world_size=world, codec=codec, pool_size=pool_size)
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        raise AgentError(f"CreateJob failed at controller {controller}: {code}: {details}") from exc
    return JobTicket(made.job_id, made.token, True)


Exchange = Callable[[Any], Any]
"""Rank 0's value in, the same value out on every rank (a broadcast)."""


def group_exchange(group: dist.ProcessGroup | None) -> Exchange:
    """Broadcast from the group's rank 0 through the process group."""

    def exchange(value: Any) -> Any:
        box = [value]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    return exchange


def share_job(
    controller: str,
    codec: str,
    pool_size: int,
    name: str,
    rank: int,
    world: int,
    exchange: Exchange,
) -> JobTicket:
    """The job every rank uses: made (or read from the environment) by rank 0 and shared by
    `exchange`; raises AgentError with rank 0's reason on every rank."""
    box: list[Any] = [None]
    if rank == 0:
        try:
            if world > MAX_WORKERS_PER_JOB:
                raise AgentError(
                    f"world size {world} is above the {MAX_WORKERS_PER_JOB} workers a job can "
                    "have on the switch"
                )
            box[0] = _make_job(controller, world, codec, pool_size, name)
        except (AgentError, ValueError, OSError) as exc:
            box[0] = str(exc)
    box[0] = exchange(box[0])
    if isinstance(box[0], str):
        raise AgentError(box[0])
    ticket: JobTicket = box[0]
    return JobTicket(ticket.job_id, ticket.token, ticket.created_here and rank == 0)


def _release_at_exit(
    agent: WorkerAgent | None, ticket: JobTicket, controller: str
) -> Callable[[], None]:
    """Leave (every rank) and release the job (the rank that created it) at exit, or earlier
    by calling the returned function (once is enough); the controller's lease ends both
    after a crash."""
    pending = [True]

    def done() -> None:
        if not pending:
            return
        pending.clear()
        if agent is not None:
            agent.close()
        if ticket.created_here:
            try:
                with _client(controller, 5.0) as client:
                    client.release(ticket.job_id)
            except Exception as exc:  # the lease ends it anyway
                if "already ended" in str(exc):  # every rank left first: nothing to release
                    return
                log.warning("job %d not released (%s); its lease will end it", ticket.job_id, exc)

    atexit.register(done)
    return done


def connect(
    codec: str = "lossless",
    *,
    controller: str | None = None,
    pool_size: int = 0,
    udp_port: int | None = None,
    name: str = "torchrun",
    group: dist.ProcessGroup | None = None,
    ranks: tuple[int, int, Exchange] | None = None,
    closers: list[Callable[[], None]] | None = None,
) -> tuple[WorkerAgent | None, str]:
    """(agent, "") on every rank that joined the job, or (None, reason): the set-up of
    `attach` without a model. `ranks` (rank, world size, exchange) replaces the process
    group's (the torch.distributed backend shares through the store); `closers` receives
    the function that leaves and releases the job before exit."""
    address = controller or os.environ.get(ENV_CONTROLLER, "")
    if not address:
        return None, f"no controller: set {ENV_CONTROLLER}=host:port or pass controller="
    rank, world, exchange = ranks or (
        dist.get_rank(group),
        dist.get_world_size(group),
        group_exchange(group),
    )
    try:
        ticket = share_job(address, codec, pool_size, name, rank, world, exchange)
    except AgentError as exc:
        return None, str(exc)
    agent, reason = None, ""
    try:
        iface = os.environ.get(ENV_IFACE, "")
        route = route_of(iface) if iface else route_to(address)
        port = udp_port or UDP_BASE_PORT + int(os.environ.get("LOCAL_RANK", "0"))
        cfg = AgentConfig(
            controller=address,
            job_id=ticket.job_id,
            token=ticket.token,
            rank=rank,
            ip=route.ip,
            udp_port=port,
            mac=route.mac,
            iface=route.iface,
            ready_timeout=60.0,
            ca_file=ca_file(),
        )
        agent, reason = open_agent(cfg)
    except AgentError as exc:
        reason = str(exc)
    if agent is not None and codec in LANE_CODECS and not agent.joined()[0].lane_ops:
        reason = (
            f"codec {codec} adds 16/8-bit lanes, which switch {agent.joined()[0].switch}'s "
            "program does not have (the TNA program drops them: docs/tofino.md)"
        )
        agent.close()
        agent = None
    done = _release_at_exit(agent, ticket, address)
    if closers is not None:
        closers.append(done)
    return agent, reason


def attach(
    model: Any,
    codec: str | None = None,
    *,
    controller: str | None = None,
    pool_size: int = 0,
    codec_options: dict[str, Any] | None = None,
    group: dist.ProcessGroup | None = None,
) -> SwitchHookState:
    """Aggregate `model`'s (a DistributedDataParallel) gradients through the switch from the
    next step on; returns the hook state (its `stats` say what happened). Call it on every
    rank after init_process_group and DDP(...); a failure falls back to the process group."""
    codec = codec or os.environ.get(ENV_CODEC, "lossless")
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; expected one of {', '.join(CODECS)}")
    agent, reason = connect(codec, controller=controller, pool_size=pool_size, group=group)
    state = SwitchHookState(
        agent,
        codec=codec,
        process_group=group,
        unavailable_reason=reason,
        codec_options=codec_options,
    )
    model.register_comm_hook(state, switch_allreduce_hook)
    return state
