"""A process group's switch job, set up from the environment by every rank together (for
`homagg.attach` and the homagg backend; docs/worker.md).

Two exchanges through the group's store (homagg/worker/job/setup_round.py), the same on every rank
whatever its environment: each rank posts what it has (controller, codec asked for, local
problems such as no route); rank 0 checks that they agree, creates the job (or reads the
launcher's) and shares its id and token; each rank joins; each posts how that went (the
job's codec, whether its switch adds the low-bit codecs' lanes); rank 0 decides for all.
The outcome is the same on every rank: a joined agent everywhere and the job's codec, or
the same reason everywhere (the caller falls back to the process group, one warning per
rank; e.g. a lane codec on a switch without lanes), or the same ValueError everywhere
(codecs that contradict each other). A rank that never takes part costs the others one
bounded wait ($HOMAGG_READY_TIMEOUT, default 60 s), and then none of them uses the switch."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import torch.distributed as dist

from homagg.api.credentials import SecretError, ca_file, job_token, operator_token
from homagg.api.tls import TlsError, client_ca
from homagg.environment import (
    CODEC_ENV,
    CONTROLLER_ENV,
    IFACE_ENV,
    JOB_ID_ENV,
    JOB_TOKEN_FILE_ENV,
    READY_TIMEOUT_ENV,
)
from homagg.wire.constants import MAX_RANKS, WORKER_UDP_BASE
from homagg.worker.codecs import DEFAULT_CODEC, check_codec, uses_lanes
from homagg.worker.job.agent import AgentConfig, AgentError, WorkerAgent, open_agent
from homagg.worker.job.route import Route, route_of, route_to
from homagg.worker.job.session import JobSession
from homagg.worker.job.setup_round import SetupRound

DEFAULT_READY_TIMEOUT = 60.0  # s, when $HOMAGG_READY_TIMEOUT is unset
CREATE_TIMEOUT = 10.0  # CreateJob, and a margin of every wait for rank 0's answer
RPC_TIMEOUT = 5.0


@dataclass(frozen=True)
class JobTicket:
    """A job this process group uses: its id and token (secret), and whether rank 0 made it
    (then rank 0 releases it)."""

    job_id: int
    token: str
    created_here: bool

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"JobTicket(job_id={self.job_id}, created_here={self.created_here})"


@dataclass(frozen=True)
class Members:
    """The ranks that set a job up together: a store they share, this rank's number among
    them, how many they are, and the group whose destruction ends the job (None: world)."""

    store: dist.Store
    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None


def group_members(group: dist.ProcessGroup | None) -> Members:
    """The members of a process group (default: the world) and its store."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    store = dist.distributed_c10d._get_process_group_store(pg)
    return Members(store, dist.get_rank(group), dist.get_world_size(group), group)


@dataclass(frozen=True)
class Request:
    """What the caller asks for: the codec ("": $HOMAGG_CODEC, else the job's or
    DEFAULT_CODEC), the names it runs besides the registered codecs (the hook's "auto"), the
    controller ("": $HOMAGG_CONTROLLER), the new job's pool size and name, this rank's UDP
    port (None: WORKER_UDP_BASE + LOCAL_RANK, else any free)."""

    codec: str = ""
    also: Sequence[str] = ()
    controller: str = ""
    pool_size: int = 0
    name: str = "torchrun"
    udp_port: int | None = None
    refusal_note: str = ""  # appended to an unknown codec's error (e.g. why auto is not here)


@dataclass
class Setup:
    """The same outcome on every rank: `agent` and the job's `codec`, or `reason` ("" with an
    agent). `complete`: every rank took part (when not, nothing may change the collectives
    the ranks issue). `session` leaves and releases the job (homagg/worker/job/session.py)."""

    agent: WorkerAgent | None
    codec: str
    reason: str
    complete: bool = True
    session: JobSession | None = None
    lane_ops: bool = False  # every rank's switch adds ADD16 / ADD8 lanes (codec="auto" uses them)


def set_up(request: Request, members: Members) -> Setup:
    """Set the job up on every member together (see module); on failure every member warns
    once with the same reason and returns it; raises the same ValueError on every member
    when the codecs asked for contradict each other or the job's."""
    here = _Local(request)
    rnd = SetupRound(members.store, members.rank, members.world_size, "homagg/setup")
    timeout = here.timeout
    answer = rnd.exchange(
        "job",
        here.view(),
        timeout,
        timeout + 2 * CREATE_TIMEOUT,
        lambda views: _decide_job(views, request, members.world_size, timeout),
    )
    if answer is None:
        return _fail(members, f"rank 0 did not share the job within {timeout:g} s", False)
    if "error" in answer:
        raise ValueError(f"homagg: {answer['error']}")
    if "reason" in answer:
        return _fail(members, answer["reason"], answer["complete"])
    job_id, token = answer["job"]
    ticket = JobTicket(int(job_id), str(token), bool(answer["created"]) and members.rank == 0)
    agent, reason = here.join(ticket, members.rank)
    wait = timeout + 2 * RPC_TIMEOUT + CREATE_TIMEOUT
    final = rnd.exchange(
        "joined",
        _joined(agent, reason),
        wait,
        wait + CREATE_TIMEOUT,
        lambda outcomes: _decide_codec(
            outcomes, answer["asked"], request, members.world_size, job_id
        ),
    )
    rnd.forget("job")  # the token leaves the store: every rank has read it
    release = here.release if ticket.created_here else None
    session = JobSession(agent, ticket.job_id, release, members.group)
    if final is not None and "codec" in final:
        lanes = bool(final.get("lane_ops", False))
        return Setup(agent, str(final["codec"]), "", True, session, lanes)
    session.close("the set-up failed")
    if final is None:
        return _fail(members, f"rank 0 did not confirm the job within {wait:g} s", False)
    if "error" in final:
        raise ValueError(f"homagg: {final['error']}")
    return _fail(members, final["reason"], final["complete"])


def _joined(agent: WorkerAgent | None, reason: str) -> dict[str, Any]:
    """What rank 0 needs to know of this rank's join: why it failed, else the job's codec
    and whether the switch adds lanes (from the assignment)."""
    given = agent.assignment if agent is not None else None
    return {
        "reason": reason,
        "codec": given.codec if given else "",
        "switch": given.switch if given else "",
        "lane_ops": given.lane_ops if given else True,
    }


def _fail(members: Members, reason: str, complete: bool) -> Setup:
    warnings.warn(
        f"homagg: rank {members.rank} falls back to the process group's all_reduce: {reason}",
        RuntimeWarning,
        stacklevel=4,
    )
    return Setup(None, "", reason, complete)


class _Local:
    """This rank's side: what it has before the exchanges, and its join."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.address = request.controller or os.environ.get(CONTROLLER_ENV, "")
        self.codec, self.source = request.codec, "codec="
        if not self.codec:
            self.codec, self.source = os.environ.get(CODEC_ENV, ""), CODEC_ENV
        self.problem = ""
        self.timeout = DEFAULT_READY_TIMEOUT
        raw = os.environ.get(READY_TIMEOUT_ENV, "")
        try:
            self.timeout = float(raw) if raw else DEFAULT_READY_TIMEOUT
            if not (math.isfinite(self.timeout) and self.timeout > 0):
                raise ValueError
        except ValueError:
            self.timeout = DEFAULT_READY_TIMEOUT
            self.problem = f"{READY_TIMEOUT_ENV}={raw!r} is not a positive number of seconds"
        self.route: Route | None = None
        if self.address and not self.problem:
            try:
                client_ca(self.address)  # TLS, or plaintext chosen: never silently plaintext
                iface = os.environ.get(IFACE_ENV, "")
                self.route = route_of(iface) if iface else route_to(self.address)
            except (AgentError, TlsError) as exc:
                self.problem = str(exc)

    def view(self) -> dict[str, Any]:
        """What rank 0 needs to know of this rank (nothing secret)."""
        return {
            "controller": self.address,
            "codec": self.codec,
            "source": self.source,
            "problem": self.problem,
        }

    def join(self, ticket: JobTicket, rank: int) -> tuple[WorkerAgent | None, str]:
        """This rank's agent in the job, or (None, why not)."""
        assert self.route is not None
        port = self.request.udp_port or WORKER_UDP_BASE + int(os.environ.get("LOCAL_RANK", "0"))
        cfg = AgentConfig(
            controller=self.address,
            job_id=ticket.job_id,
            token=ticket.token,
            rank=rank,
            ip=self.route.ip,
            udp_port=port,
            mac=self.route.mac,
            iface=self.route.iface,
            ready_timeout=self.timeout,
            rpc_timeout=RPC_TIMEOUT,
            ca_file=ca_file(),
        )
        return open_agent(cfg)

    def release(self, job_id: int) -> None:
        """End the job rank 0 created (with its operator credential)."""
        with _client(self.address, RPC_TIMEOUT) as client:
            client.release(job_id)


def _decide_job(
    views: dict[int, dict[str, Any]], request: Request, world_size: int, timeout: float
) -> dict[str, Any]:
    """Rank 0: the job every rank uses, or why there is none (see module)."""
    missing = [r for r in range(world_size) if r not in views]
    if missing:
        return {
            "reason": f"rank(s) {missing} did not start the homagg set-up within {timeout:g} s "
            f"({READY_TIMEOUT_ENV})",
            "complete": False,
        }
    asked = {r: (v["codec"], v["source"]) for r, v in views.items() if v["codec"]}
    for r, (codec, source) in asked.items():
        try:
            check_codec(codec, also=request.also)
        except ValueError as exc:
            return {"error": f"{source} on rank {r}: {exc}{request.refusal_note}"}
    if len({codec for codec, _ in asked.values()}) > 1:
        said = ", ".join(f"rank {r} {c!r} ({s})" for r, (c, s) in sorted(asked.items()))
        return {"error": f"the ranks ask for different codecs: {said}; give every rank the same"}
    codec = next(iter(asked.values()), ("", ""))
    reason = _environment_problem(views, world_size)
    if not reason:
        try:
            ticket = _make_job(views[0]["controller"], world_size, codec[0], request)
        except (AgentError, ValueError, OSError) as exc:
            reason = str(exc)
        else:
            job = [ticket.job_id, ticket.token]
            return {"job": job, "created": ticket.created_here, "asked": list(codec)}
    return {"reason": reason, "complete": True}


def _environment_problem(views: dict[int, dict[str, Any]], world_size: int) -> str:
    """Why the ranks' environments do not allow a job ("" when they do)."""
    have = [r for r, v in sorted(views.items()) if v["controller"]]
    if not have:
        return f"no controller: set {CONTROLLER_ENV}=host:port or pass controller="
    if len(have) < world_size:
        lack = [r for r in range(world_size) if r not in have]
        return (
            f"{CONTROLLER_ENV} (or controller=) is set on rank(s) {have} but not on rank(s) "
            f"{lack}: give every rank the controller"
        )
    problems = [f"rank {r}: {v['problem']}" for r, v in sorted(views.items()) if v["problem"]]
    if problems:
        return "; ".join(problems)
    if world_size > MAX_RANKS:  # above 32 the controller checks its topology has a tree
        return (
            f"world size {world_size} is above the {MAX_RANKS} ranks a job can have (32 on "
            "one switch, up to 256 on a tree of switches)"
        )
    return ""


def _decide_codec(
    outcomes: dict[int, dict[str, Any]],
    asked: list[str],
    request: Request,
    world_size: int,
    job_id: int,
) -> dict[str, Any]:
    """Rank 0: every rank joined and the job's codec is one the ranks can run, the one
    they asked for (a job made outside the script decides the codec) and, when it adds
    lanes, one their switch adds (the assignment's lane_ops), or why not."""
    missing = [r for r in range(world_size) if r not in outcomes]
    if missing:
        return {"reason": f"rank(s) {missing} did not report their join", "complete": False}
    failed = [f"rank {r}: {o['reason']}" for r, o in sorted(outcomes.items()) if o["reason"]]
    if failed:
        return {"reason": "; ".join(failed), "complete": True}
    codecs = {o["codec"] for o in outcomes.values()}
    job_codec = codecs.pop() if len(codecs) == 1 else ""
    try:
        check_codec(job_codec, also=request.also)
    except ValueError as exc:
        return {
            "error": f"job {job_id} was made with codec {job_codec!r}, not one this worker "
            f"runs ({exc}){request.refusal_note}"
        }
    codec, source = asked or ("", "")
    if codec and codec != job_codec:
        return {
            "error": f"job {job_id} runs codec {job_codec!r} (chosen where it was made: "
            f"homagg-run --codec, aggctl job create --codec), but {source} asks for {codec!r}: "
            f"drop {source} or make the job with --codec {codec}"
        }
    lacking = sorted({o["switch"] for o in outcomes.values() if not o["lane_ops"]})
    if uses_lanes(job_codec) and lacking:
        return {
            "reason": f"codec {job_codec} adds 16/8-bit lanes (ADD16, ADD8), which the "
            f"program of switch {', '.join(lacking)} does not have (the TNA program drops "
            "them: docs/tofino.md): use a codec without lanes",
            "complete": True,
        }
    return {"codec": job_codec, "lane_ops": not lacking}


def _token_from_env() -> str:
    try:
        return job_token() or ""
    except SecretError as exc:
        raise AgentError(f"the job token ({JOB_TOKEN_FILE_ENV}): {exc}") from exc


def _client(controller: str, timeout: float) -> Any:
    """A client of the controller with this process's CA and operator credential."""
    from homagg.api.client import ControllerClient

    try:
        return ControllerClient(controller, timeout, ca_file(), operator_token())
    except (SecretError, TlsError) as exc:
        raise AgentError(f"cannot reach the controller {controller} securely: {exc}") from exc


def _make_job(controller: str, world_size: int, codec: str, request: Request) -> JobTicket:
    """Rank 0's part: the launcher's job from the environment, or a new one."""
    if os.environ.get(JOB_ID_ENV):
        return JobTicket(int(os.environ[JOB_ID_ENV]), _token_from_env(), False)
    try:
        with _client(controller, CREATE_TIMEOUT) as client:
            made = client.create_job(
                request.name,
                world_size=world_size,
                codec=codec or DEFAULT_CODEC,
                pool_size=request.pool_size,
            )
    except grpc.RpcError as exc:
        code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise AgentError(f"CreateJob failed at controller {controller}: {code}: {details}") from exc
    return JobTicket(made.job_id, made.token, True)


__all__ = ["JobTicket", "Members", "Request", "Setup", "group_members", "set_up"]
