"""The worker agent: registers one rank of a job with the controller, opens the UDP channel
to the switch, builds the transport from the assignment, and keeps the rank's lease alive
with a heartbeat thread until it leaves (docs/worker.md). The heartbeats also carry the
give-ups between the ranks: this rank's, sent at once, and the others', from the answers
(homagg/worker/transport/straggler_wait.py)."""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from homagg.api.assignment import Assignment
from homagg.api.client import ControllerClient
from homagg.api.tls import TlsError
from homagg.api.validation import (
    JOB_IDS,
    POOL_SIZES,
    UDP_PORTS,
    WORLD_SIZES,
    is_unicast,
    span,
)
from homagg.control.job_record import GaveUp
from homagg.wire.constants import CELLS_CHOICES, agg_udp_length
from homagg.worker.transport.channel import Channel, UdpChannel
from homagg.worker.transport.switch_transport import SwitchTransport, TransportConfig

log = logging.getLogger(__name__)
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MAX_LEASE_S = 86400.0  # a longer lease or heartbeat interval is a broken controller
READY_RETRY_S = 0.5  # between WaitReady calls the controller refused as over its limit

# Heartbeat answers after which the job cannot come back: the agent stays unhealthy.
_FATAL_CODES = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
)


class AgentError(RuntimeError):
    """The controller refused or could not be reached; `code` is the gRPC status (or None)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AgentConfig:
    """Where the controller is, which job and rank, and this worker's addresses."""

    controller: str
    job_id: int
    token: str = field(repr=False)  # secret: never in a log line or a traceback
    rank: int
    ip: str
    udp_port: int  # when another socket holds it (a second job, a new_group): any free port
    switch_port: int | None = None  # None: the controller finds it in its topology
    mac: str = ""  # empty: read from /sys/class/net/<iface>/address
    iface: str = ""
    ready_timeout: float = 30.0
    rpc_timeout: float = 5.0
    # The transport's retransmission timing and straggler wait (TransportConfig's fields).
    initial_timeout: float = 0.02
    max_timeout: float = 0.5
    min_timeout: float = 0.005
    adaptive_timeout: bool = True
    max_retries: int = 12
    dead_path_s: float = 3.0
    max_straggler_wait: float = 120.0
    # The controller's TLS certificate is verified against ca_file (None: $HOMAGG_CA_FILE);
    # plaintext only when chosen: insecure, or $HOMAGG_INSECURE=1 (homagg/api/tls.py)
    ca_file: Path | None = None
    insecure: bool = False


def interface_mac(iface: str) -> str:
    """The MAC address of a network interface of this namespace, from sysfs."""
    try:
        return Path(f"/sys/class/net/{iface}/address").read_text().strip()
    except OSError as exc:
        raise AgentError(f"cannot read the MAC of interface {iface!r}: {exc}") from exc


def _assignment_problem(a: Assignment, cfg: AgentConfig) -> str:
    """What is wrong with an assignment ("" when nothing): a worker must not run on values
    that cannot work (no slots, no heartbeat, a rank outside the world, an address that does
    not parse, a packet layout this build does not have)."""
    if a.job_id not in JOB_IDS or a.job_id != cfg.job_id:
        return f"job_id {a.job_id}, but this worker joined job {cfg.job_id}"
    if a.world_size not in WORLD_SIZES:
        return f"world_size {a.world_size} outside {span(WORLD_SIZES)}"
    if a.rank not in range(a.world_size) or a.rank != cfg.rank:
        return f"rank {a.rank} (world size {a.world_size}), but this worker is rank {cfg.rank}"
    if a.pool_size not in POOL_SIZES:
        return f"pool_size {a.pool_size} outside {span(POOL_SIZES)}"
    if a.cells_per_packet not in CELLS_CHOICES:
        return (
            f"cells_per_packet {a.cells_per_packet} is none of {CELLS_CHOICES} "
            "(homagg.wire.constants.CELLS_CHOICES)"
        )
    if a.udp_port not in UDP_PORTS:
        return f"udp_port {a.udp_port} outside {span(UDP_PORTS)}"
    try:
        ip = ipaddress.IPv4Address(a.service_ip)
    except ValueError:
        return f"service_ip {a.service_ip!r} is not an IPv4 address"
    if not is_unicast(ip):
        return f"service_ip {a.service_ip} is not a unicast address"
    if not (math.isfinite(a.lease_s) and 0 < a.lease_s <= MAX_LEASE_S):
        return f"lease_s {a.lease_s} outside (0, {MAX_LEASE_S:g}]"
    if not (math.isfinite(a.heartbeat_interval_s) and a.heartbeat_interval_s > 0):
        return f"heartbeat_interval_s {a.heartbeat_interval_s} is not a positive number"
    if a.heartbeat_interval_s > a.lease_s / 2:
        return (
            f"heartbeat_interval_s {a.heartbeat_interval_s:g} is more than half the lease "
            f"({a.lease_s:g} s): the lease would run out between heartbeats"
        )
    return ""


def _rpc_error(what: str, exc: grpc.RpcError, address: str) -> AgentError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "UNKNOWN"
    return AgentError(f"{what} failed at controller {address}: {name}: {details}", code)


class WorkerAgent:
    """One rank of a job: joined, assigned, heartbeating; `transport` aggregates through the switch.

    `socket_factory` makes the UDP socket (e.g. inside a network namespace); the agent binds
    it to (ip, udp_port), or to a free port when that one is taken, before it joins. Use as a
    context manager: close() stops the heartbeat and leaves."""

    def __init__(
        self, config: AgentConfig, socket_factory: Callable[[], socket.socket] | None = None
    ) -> None:
        self.config = config
        self.healthy = False
        self.unhealthy_reason = "not started"
        self.heartbeats = 0
        self.heartbeat_failures = 0
        self.proven_at = -math.inf  # monotonic time the controller last vouched for the job
        self.assignment: Assignment | None = None
        self.transport: SwitchTransport | None = None
        self.peer_gave_up: GaveUp | None = None  # the newest give-up another rank told
        self._gave_up: GaveUp | None = None  # this rank's newest, sent with every heartbeat
        self._gave_up_lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Event()  # a heartbeat now, not after the interval
        self._fatal = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._joined = False  # JoinJob answered: close() leaves (or un-joins) the job
        self._left = False
        self._sock: socket.socket | None = None
        self.udp_port = 0  # the port bound and registered (the configured one unless taken)
        try:
            self.client = ControllerClient(
                config.controller,
                timeout=config.rpc_timeout,
                ca_file=config.ca_file,
                insecure=config.insecure,
            )
        except TlsError as exc:
            raise AgentError(f"no TLS to the controller {config.controller}: {exc}") from exc
        try:
            self._bind(socket_factory or (lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)))
            self._register()
            self._open_transport()
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name=f"heartbeat-r{config.rank}", daemon=True
        )
        self._thread.start()

    def joined(self) -> tuple[Assignment, SwitchTransport]:
        """The assignment and the transport of this joined agent (an AgentError once the
        agent is closed: both are gone then)."""
        if self.assignment is None or self.transport is None:
            raise AgentError("the agent is not in its job (closed, or the join failed)")
        return self.assignment, self.transport

    @property
    def mac(self) -> str:
        """The MAC this rank registers (configured, or read from its interface)."""
        if self.config.mac:
            return self.config.mac
        if not self.config.iface:
            raise AgentError("neither a MAC nor an interface to read it from was given")
        return interface_mac(self.config.iface)

    def _bind(self, socket_factory: Callable[[], socket.socket]) -> None:
        """Bind the UDP socket before joining, so the port the controller installs is one
        this rank holds: the configured port, or any free one when another socket (a second
        job on this host, a `dist.new_group` under the homagg backend) already has it."""
        cfg = self.config
        sock = socket_factory()
        try:
            try:
                sock.bind((cfg.ip, cfg.udp_port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                sock.bind((cfg.ip, 0))
                log.info(
                    "rank %d: UDP %s:%d is taken; using port %d",
                    cfg.rank,
                    cfg.ip,
                    cfg.udp_port,
                    sock.getsockname()[1],
                )
        except OSError as exc:
            sock.close()
            raise AgentError(f"cannot bind UDP {cfg.ip}:{cfg.udp_port}: {exc}") from exc
        self._sock, self.udp_port = sock, sock.getsockname()[1]

    def _register(self) -> None:
        cfg = self.config
        try:
            self.client.join(
                cfg.job_id, cfg.token, cfg.rank, self.mac, cfg.ip, self.udp_port, cfg.switch_port
            )
        except grpc.RpcError as exc:
            raise _rpc_error("JoinJob", exc, cfg.controller) from exc
        self._joined = True
        msg = self._wait_ready()
        assignment = Assignment.from_message(msg)
        problem = _assignment_problem(assignment, cfg)
        if problem:
            raise AgentError(
                f"the controller at {cfg.controller} sent an unusable assignment: {problem}"
            )
        self.assignment = assignment
        self.healthy, self.unhealthy_reason = True, ""
        self.proven_at = time.monotonic()
        log.info(
            "rank %d in job %d from %s:%d (switch %s, pool %d, codec %s); %r",
            cfg.rank,
            cfg.job_id,
            cfg.ip,
            self.udp_port,
            assignment.switch,
            assignment.pool_size,
            assignment.codec,
            cfg,
        )

    def _wait_ready(self) -> Any:
        """WaitReady within ready_timeout, again while the controller answers that too many
        calls are waiting (RESOURCE_EXHAUSTED: its limit protects the other tenants)."""
        cfg = self.config
        deadline = time.monotonic() + cfg.ready_timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                return self.client.wait_ready(cfg.job_id, cfg.token, cfg.rank, timeout_s=remaining)
            except grpc.RpcError as exc:
                busy = isinstance(exc, grpc.Call) and exc.code() == RESOURCE_EXHAUSTED
                if not busy or remaining <= READY_RETRY_S:
                    raise _rpc_error("WaitReady", exc, cfg.controller) from exc
            time.sleep(READY_RETRY_S)

    def _open_transport(self) -> None:
        cfg, a, sock = self.config, self.assignment, self._sock
        assert a is not None and sock is not None
        self._sock = None  # the channel owns it now
        udp = UdpChannel(sock, (a.service_ip, a.udp_port))
        udp.hold_results(a.pool_size, agg_udp_length(a.cells_per_packet))
        channel: Channel = udp
        try:
            tcfg = TransportConfig(
                job_id=a.job_id,
                rank=a.rank,
                world_size=a.world_size,
                pool_size=a.pool_size,
                initial_timeout=cfg.initial_timeout,
                max_timeout=cfg.max_timeout,
                min_timeout=cfg.min_timeout,
                adaptive_timeout=cfg.adaptive_timeout,
                max_retries=cfg.max_retries,
                dead_path_s=cfg.dead_path_s,
                max_straggler_wait=cfg.max_straggler_wait,
                lane_ops=a.lane_ops,
                cells_per_packet=a.cells_per_packet,
            )
            self.transport = SwitchTransport(
                tcfg,
                channel,
                peers_problem=self.peers_problem,
                peers_unproven=self.peers_unproven,
                told=lambda: self.peer_gave_up,
                tell=self.tell_peers,
            )
        except ValueError as exc:  # a value the checks above missed: still a clear refusal
            channel.close()
            raise AgentError(f"cannot build the transport from the assignment: {exc}") from exc

    def peers_problem(self) -> str:
        """Why the peers are gone: "" while this rank's heartbeats are answered (the controller
        ends the job when any rank's lease expires, so an answer proves them), and also while
        the controller cannot be reached: that is no evidence either way, and the data plane
        sums without it (`peers_unproven` bounds a wait on peers nobody vouches for). The
        reason once the controller said the job is over (a fatal answer) or the agent closed."""
        if self.healthy or not (self._fatal or self._closed):
            return ""
        return self.unhealthy_reason or "the agent is unhealthy"

    def peers_unproven(self) -> str:
        """Why nothing proves the peers alive any more ("" while something does): no heartbeat
        was answered for longer than the lease and a heartbeat interval. Had the controller
        answered, a peer dead since its last answer would have been reported by then (its
        lease expired, the job ended), so a rank waiting on a peer during a controller outage
        waits no longer than the controller would have waited on a silent peer. A controller
        that comes back restores the job with fresh leases (homagg/control/restore.py): its
        answers prove the peers again, and a dead peer is reported a lease later."""
        a = self.assignment
        if a is None:
            return ""
        silent = time.monotonic() - self.proven_at
        bound = a.lease_s + a.heartbeat_interval_s
        if silent <= bound:
            return ""
        why = f" ({self.unhealthy_reason})" if self.unhealthy_reason else ""
        return (
            f"no heartbeat answered for {silent:.1f} s{why}: nothing proves the peers alive "
            f"(a dead peer's lease, {a.lease_s:g} s, would have been reported by now)"
        )

    def tell_peers(self, gave_up: GaveUp) -> None:
        """Tell the other ranks, through the controller and at once, that this rank gave up a
        call. Every later heartbeat carries this rank's newest give-up again (the controller
        keeps the newest and ignores the rest), so a restarted controller learns it too."""
        with self._gave_up_lock:
            if self._gave_up is None or gave_up.chunk >= self._gave_up.chunk:
                self._gave_up = gave_up
        self._beat.set()

    def _heard(self, answer: Any) -> None:
        """A heartbeat was answered: its give-up, if another rank's, is the peers' newest."""
        if not answer.HasField("gave_up") or answer.gave_up.rank == self.config.rank:
            return
        gave_up = GaveUp.from_message(answer.gave_up)
        if gave_up != self.peer_gave_up:
            log.info("rank %d: told that %s", self.config.rank, gave_up)
            self.peer_gave_up = gave_up

    def _heartbeat_loop(self) -> None:
        assert self.assignment is not None
        interval = max(0.05, self.assignment.heartbeat_interval_s)
        cfg = self.config
        while True:
            self._beat.wait(interval)
            self._beat.clear()
            if self._stop.is_set():
                return
            try:
                answer = self.client.heartbeat(cfg.job_id, cfg.token, cfg.rank, self._gave_up)
            except grpc.RpcError as exc:
                self.heartbeat_failures += 1
                err = _rpc_error("Heartbeat", exc, cfg.controller)
                self._fatal = self._fatal or err.code in _FATAL_CODES
                if self.healthy:
                    log.warning("rank %d unhealthy: %s", cfg.rank, err)
                self.healthy, self.unhealthy_reason = False, str(err)
                continue
            self.heartbeats += 1
            self.proven_at = time.monotonic()
            self._heard(answer)
            if not self._fatal and not self.healthy:
                log.info("rank %d healthy again (heartbeat answered)", cfg.rank)
                self.healthy, self.unhealthy_reason = True, ""

    def close(self) -> None:
        """Stop the heartbeat, leave the job (best effort) and close the socket and channel."""
        self._stop.set()
        self._beat.set()
        if self._thread is not None:
            self._thread.join(self.config.rpc_timeout + 1)
        if self._joined and not self._left:
            self._left = True
            try:
                self.client.leave(self.config.job_id, self.config.token, self.config.rank)
            except grpc.RpcError as exc:
                log.info(
                    "LeaveJob of rank %d: %s",
                    self.config.rank,
                    _rpc_error("LeaveJob", exc, "").args[0],
                )
        self._closed = True
        self.healthy = False
        self.unhealthy_reason = "closed"
        if self.transport is not None:
            self.transport.channel.close()
        if self._sock is not None:  # bound, but the join failed before the channel took it
            self._sock.close()
            self._sock = None
        self.client.close()

    def __enter__(self) -> WorkerAgent:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_agent(
    config: AgentConfig, socket_factory: Callable[[], socket.socket] | None = None
) -> tuple[WorkerAgent | None, str]:
    """(agent, "") or (None, reason): for training scripts that fall back instead of failing."""
    try:
        return WorkerAgent(config, socket_factory), ""
    except AgentError as exc:
        return None, str(exc)
