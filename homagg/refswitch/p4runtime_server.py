"""The reference switch's P4Runtime gRPC server: answers like PI, BMv2's simple_switch_grpc server.

Behaviour worth knowing (PI's, unless marked "ours"):
- Arbitration: default role only (ours: a named role gets an arbitration reply with
  UNIMPLEMENTED and the stream ends with UNIMPLEMENTED). The highest election id is
  primary (status OK, "Is primary"); the others get ALREADY_EXISTS ("Is backup"). When
  the primary changes every stream is told; a repeated election id ends the new stream
  with INVALID_ARGUMENT; at most 16 streams (RESOURCE_EXHAUSTED). A wrong device id ends
  the stream, and fails any RPC, with NOT_FOUND (ours: PI creates devices on demand).
- Write and SetForwardingPipelineConfig need the primary's election id (PERMISSION_DENIED
  "Not primary"); with no stream open, a request without election id is accepted.
- Write applies updates with CONTINUE_ON_ERROR semantics; ROLLBACK_ON_ERROR and
  DATAPLANE_ATOMIC are UNIMPLEMENTED. When an update fails the RPC status is UNKNOWN and
  its details (grpc-status-details-bin) hold one p4.v1.Error per update, OK included.
- Pipeline actions: VERIFY checks only; VERIFY_AND_SAVE installs the pipeline at once
  (state reset) and a later COMMIT just confirms it; VERIFY_AND_COMMIT installs;
  RECONCILE_AND_COMMIT is treated as VERIFY_AND_COMMIT (ours: state is not preserved).
- PacketOut (ours): the program has no controller port, so a PacketOut from the primary
  is answered with a StreamError (UNIMPLEMENTED) carrying the packet; digest acks and
  anything sent before arbitration are ignored.
- Any exception escaping a handler is logged and answered INTERNAL.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, Protocol

import grpc
from google.rpc import code_pb2, status_pb2

from homagg.p4rt.api import GRPC_OPTIONS, p4info_pb2, p4runtime_pb2, p4runtime_pb2_grpc
from homagg.p4rt.p4info import P4InfoIndex
from homagg.refswitch.device import Device, DeviceError
from homagg.refswitch.p4runtime_read import read_entities
from homagg.refswitch.p4runtime_write import apply_write, write_failure_status

log = logging.getLogger(__name__)

API_VERSION = "1.3.0"  # what PI's server reports
MAX_CONNECTIONS = 16
READ_CHUNK = 1000  # entities per ReadResponse
ConfigValidator = Callable[[p4info_pb2.P4Info, bytes], None]
SetAction = p4runtime_pb2.SetForwardingPipelineConfigRequest


class DeviceObserver(Protocol):
    """A data plane outside the Device (the eBPF target's maps) kept in step with it; both
    calls are made with Device.lock held."""

    def changed(self) -> None:
        """The Device's tables, groups or pipeline changed: mirror them."""

    def refresh(self) -> None:
        """The Device is about to be read or written: bring its counters up to date."""


GetType = p4runtime_pb2.GetForwardingPipelineConfigRequest


class RpcFailure(Exception):
    """Ends an RPC with a gRPC status (and optional google.rpc.Status details)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, details: status_pb2.Status | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


def _grpc_code(code: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)


def _fail(context: grpc.ServicerContext, failure: RpcFailure) -> None:
    if failure.details is not None:
        context.set_trailing_metadata(
            (("grpc-status-details-bin", failure.details.SerializeToString()),)
        )
    context.set_code(failure.code)
    context.set_details(failure.message)


def _guard(response_type: type) -> Callable:
    """Turn RpcFailure into a status and any other exception into INTERNAL (unary handlers)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def handler(self: P4RuntimeServicer, request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return method(self, request, context)
            except RpcFailure as failure:
                _fail(context, failure)
            except Exception as exc:  # never a traceback through gRPC
                log.exception("P4Runtime %s failed", method.__name__)
                _fail(context, RpcFailure(grpc.StatusCode.INTERNAL, f"internal error: {exc}"))
            return response_type()

        return handler

    return wrap


def _uint128(value: p4runtime_pb2.Uint128) -> int:
    return (value.high << 64) | value.low


class _Connection:
    """One StreamChannel: its election id and the queue of messages to send it."""

    def __init__(self) -> None:
        self.election_id: int | None = None  # None until its first arbitration
        self.outbox: queue.Queue[Any] = queue.Queue()


_END = object()  # outbox marker: end the stream


class _Arbiter:
    """Primary election among the streams of the device (default role)."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.lock = threading.Lock()
        self.connections: list[_Connection] = []

    def primary(self) -> _Connection | None:
        return max(self.connections, key=lambda c: c.election_id or 0, default=None)

    def is_primary(self, election_id: int) -> bool:
        with self.lock:
            primary = self.primary()
            return primary is not None and primary.election_id == election_id

    def count(self) -> int:
        with self.lock:
            return len(self.connections)

    def arbitrate(self, conn: _Connection, election_id: int) -> None:
        """Add the connection or change its election id, and notify as PI does."""
        with self.lock:
            if conn.election_id == election_id:
                return  # PI: nothing changes, nothing is sent
            known = conn.election_id is not None
            if not known and len(self.connections) >= MAX_CONNECTIONS:
                raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "Too many connections")
            if any(c.election_id == election_id for c in self.connections if c is not conn):
                raise RpcFailure(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "New election id already exists" if known else "Election id already exists",
                )
            was_primary = known and self.primary() is conn
            conn.election_id = election_id
            if not known:
                self.connections.append(conn)
            is_primary = self.primary() is conn
            if is_primary != was_primary:
                self._notify_all()
            else:
                self._notify(conn)

    def remove(self, conn: _Connection) -> None:
        """Forget a closed stream; if it was primary, tell the others who is primary now."""
        with self.lock:
            if conn not in self.connections:
                return
            was_primary = self.primary() is conn
            self.connections.remove(conn)
            if was_primary:
                self._notify_all()

    def close_all(self) -> None:
        with self.lock:
            for conn in self.connections:
                conn.outbox.put(_END)

    def _notify_all(self) -> None:
        for conn in self.connections:
            self._notify(conn)

    def _notify(self, conn: _Connection) -> None:
        primary = self.primary()
        assert primary is not None and primary.election_id is not None
        response = p4runtime_pb2.StreamMessageResponse()
        arb = response.arbitration
        arb.device_id = self.device_id
        arb.election_id.high, arb.election_id.low = (
            primary.election_id >> 64,
            primary.election_id & (2**64 - 1),
        )
        if conn is primary:
            arb.status.code, arb.status.message = code_pb2.OK, "Is primary"
        else:
            arb.status.code, arb.status.message = code_pb2.ALREADY_EXISTS, "Is backup"
        conn.outbox.put(response)


class P4RuntimeServicer(p4runtime_pb2_grpc.P4RuntimeServicer):
    """The P4Runtime service over one Device (see the module docstring for the semantics)."""

    def __init__(
        self,
        device: Device,
        device_id: int,
        validate_config: ConfigValidator | None = None,
        api_version: str = API_VERSION,
        observer: DeviceObserver | None = None,
    ) -> None:
        self.device = device
        self.device_id = device_id
        self.validate_config = validate_config
        self.api_version = api_version
        self.observer = observer
        self.arbiter = _Arbiter(device_id)
        self._saved = False  # a VERIFY_AND_SAVE awaits its COMMIT

    # -- checks shared by the RPCs ------------------------------------------------------

    def _check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, f"Unknown device id {device_id}")

    def _check_role(self, request: Any) -> None:
        if request.role or request.role_id:
            raise RpcFailure(grpc.StatusCode.UNIMPLEMENTED, "Only the default role is supported")

    def _check_primary(self, request: Any) -> None:
        if self.arbiter.count() == 0:
            if request.HasField("election_id"):
                raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED, "Not primary")
        elif not self.arbiter.is_primary(_uint128(request.election_id)):
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED, "Not primary")

    def _check_pipeline(self) -> None:
        if self.device.p4info is None:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                "No forwarding pipeline config set for this device",
            )

    # -- unary RPCs -------------------------------------------------------------------

    @_guard(p4runtime_pb2.CapabilitiesResponse)
    def Capabilities(
        self, request: p4runtime_pb2.CapabilitiesRequest, context: grpc.ServicerContext
    ) -> p4runtime_pb2.CapabilitiesResponse:
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=self.api_version)

    @_guard(p4runtime_pb2.WriteResponse)
    def Write(
        self, request: p4runtime_pb2.WriteRequest, context: grpc.ServicerContext
    ) -> p4runtime_pb2.WriteResponse:
        self._check_device(request.device_id)
        self._check_role(request)
        self._check_primary(request)
        self._check_pipeline()
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            raise RpcFailure(
                grpc.StatusCode.UNIMPLEMENTED,
                "Support for atomic write modes has not been implemented yet",
            )
        with self.device.lock:
            if self.observer is not None:
                self.observer.refresh()
            results = apply_write(self.device, request)
            if self.observer is not None:
                self.observer.changed()
        if any(code != code_pb2.OK for code, _ in results):
            status = write_failure_status(results)
            raise RpcFailure(grpc.StatusCode.UNKNOWN, status.message, status)
        return p4runtime_pb2.WriteResponse()

    @_guard(p4runtime_pb2.SetForwardingPipelineConfigResponse)
    def SetForwardingPipelineConfig(
        self,
        request: p4runtime_pb2.SetForwardingPipelineConfigRequest,
        context: grpc.ServicerContext,
    ) -> p4runtime_pb2.SetForwardingPipelineConfigResponse:
        self._check_device(request.device_id)
        self._check_role(request)
        self._check_primary(request)
        action = request.action
        if action not in (
            SetAction.VERIFY,
            SetAction.VERIFY_AND_SAVE,
            SetAction.VERIFY_AND_COMMIT,
            SetAction.COMMIT,
            SetAction.RECONCILE_AND_COMMIT,
        ):
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT, "Invalid SetForwardingPipeline action"
            )
        config = request.config
        if action == SetAction.COMMIT:
            if not self._saved:
                raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "No saved config to commit")
            self._saved = False
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        try:
            P4InfoIndex(config.p4info)
        except Exception as exc:  # any malformed P4Info
            raise RpcFailure(
                grpc.StatusCode.UNKNOWN, f"Error when importing p4info: {exc}"
            ) from exc
        if self.validate_config is not None:
            try:
                self.validate_config(config.p4info, config.p4_device_config)
            except ValueError as exc:
                raise RpcFailure(
                    grpc.StatusCode.INVALID_ARGUMENT, f"Invalid device config: {exc}"
                ) from exc
        if action == SetAction.VERIFY:
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        with self.device.lock:
            self.device.load_pipeline(config.p4info, config.p4_device_config)
            self.device.cookie = config.cookie.cookie if config.HasField("cookie") else None
            if self.observer is not None:
                self.observer.changed()
        self._saved = action == SetAction.VERIFY_AND_SAVE
        log.info(
            "pipeline installed (%d tables, %d bytes of device config)",
            len(config.p4info.tables),
            len(config.p4_device_config),
        )
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    @_guard(p4runtime_pb2.GetForwardingPipelineConfigResponse)
    def GetForwardingPipelineConfig(
        self,
        request: p4runtime_pb2.GetForwardingPipelineConfigRequest,
        context: grpc.ServicerContext,
    ) -> p4runtime_pb2.GetForwardingPipelineConfigResponse:
        self._check_device(request.device_id)
        self._check_pipeline()
        kind = request.response_type
        if kind not in (
            GetType.ALL,
            GetType.COOKIE_ONLY,
            GetType.P4INFO_AND_COOKIE,
            GetType.DEVICE_CONFIG_AND_COOKIE,
        ):
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                "Invalid response_type in GetForwardingPipelineConfigRequest",
            )
        response = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        with self.device.lock:
            assert self.device.p4info_proto is not None
            if kind in (GetType.ALL, GetType.P4INFO_AND_COOKIE):
                response.config.p4info.CopyFrom(self.device.p4info_proto)
            if kind in (GetType.ALL, GetType.DEVICE_CONFIG_AND_COOKIE):
                response.config.p4_device_config = self.device.device_config
            if self.device.cookie is not None:
                response.config.cookie.cookie = self.device.cookie
        return response

    # -- streaming RPCs -------------------------------------------------------------------

    def Read(
        self, request: p4runtime_pb2.ReadRequest, context: grpc.ServicerContext
    ) -> Iterator[p4runtime_pb2.ReadResponse]:
        try:
            self._check_device(request.device_id)
            self._check_pipeline()
            with self.device.lock:
                if self.observer is not None:
                    self.observer.refresh()
                entities = read_entities(self.device, request)
        except DeviceError as exc:
            _fail(context, RpcFailure(_grpc_code(exc.code), exc.message))
            return
        except RpcFailure as failure:
            _fail(context, failure)
            return
        except Exception as exc:
            log.exception("P4Runtime Read failed")
            _fail(context, RpcFailure(grpc.StatusCode.INTERNAL, f"internal error: {exc}"))
            return
        for start in range(0, max(len(entities), 1), READ_CHUNK):
            yield p4runtime_pb2.ReadResponse(entities=entities[start : start + READ_CHUNK])

    def StreamChannel(
        self,
        request_iterator: Iterator[p4runtime_pb2.StreamMessageRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        conn = _Connection()
        context.add_callback(lambda: conn.outbox.put(_END))
        reader = threading.Thread(
            target=self._read_stream,
            args=(request_iterator, conn),
            name="p4rt-stream-reader",
            daemon=True,
        )
        reader.start()
        try:
            while True:
                item = conn.outbox.get()
                if item is _END:
                    return
                if isinstance(item, RpcFailure):
                    _fail(context, item)
                    return
                yield item
        finally:
            self.arbiter.remove(conn)

    def _read_stream(
        self, requests: Iterator[p4runtime_pb2.StreamMessageRequest], conn: _Connection
    ) -> None:
        try:
            for request in requests:
                kind = request.WhichOneof("update")
                if kind == "arbitration":
                    self._on_arbitration(conn, request.arbitration)
                elif kind == "packet" and conn.election_id is not None:
                    self._on_packet_out(conn, request.packet)
                # digest_ack, other, and anything before arbitration: ignored, as PI does
        except RpcFailure as failure:
            conn.outbox.put(failure)
        except grpc.RpcError:
            pass  # the stream was cancelled or the server is stopping
        except Exception as exc:
            log.exception("P4Runtime StreamChannel failed")
            conn.outbox.put(RpcFailure(grpc.StatusCode.INTERNAL, f"internal error: {exc}"))
        finally:
            self.arbiter.remove(conn)
            conn.outbox.put(_END)

    def _on_arbitration(
        self, conn: _Connection, arb: p4runtime_pb2.MasterArbitrationUpdate
    ) -> None:
        if arb.device_id != self.device_id:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, f"Unknown device id {arb.device_id}")
        if arb.role.name or arb.role.id or arb.role.HasField("config"):
            reply = p4runtime_pb2.StreamMessageResponse()
            reply.arbitration.CopyFrom(arb)
            reply.arbitration.status.code = code_pb2.UNIMPLEMENTED
            reply.arbitration.status.message = "Only the default role is supported"
            conn.outbox.put(reply)
            raise RpcFailure(grpc.StatusCode.UNIMPLEMENTED, "Only the default role is supported")
        self.arbiter.arbitrate(conn, _uint128(arb.election_id))

    def _on_packet_out(self, conn: _Connection, packet: p4runtime_pb2.PacketOut) -> None:
        if self.device.p4info is None or not self.arbiter.is_primary(conn.election_id or 0):
            return
        log.warning(
            "PacketOut of %d bytes refused: the program has no controller port", len(packet.payload)
        )
        response = p4runtime_pb2.StreamMessageResponse()
        response.error.canonical_code = code_pb2.UNIMPLEMENTED
        response.error.message = "PacketOut is not supported: the program has no controller port"
        response.error.packet_out.packet_out.CopyFrom(packet)
        conn.outbox.put(response)

    def close(self) -> None:
        """End every open stream (the server is stopping)."""
        self.arbiter.close_all()


class P4RuntimeServer:
    """A gRPC server exposing P4RuntimeServicer for one Device."""

    def __init__(
        self,
        device: Device,
        device_id: int,
        address: str = "127.0.0.1:0",
        *,
        validate_config: ConfigValidator | None = None,
        max_workers: int = 40,
        api_version: str = API_VERSION,
        observer: DeviceObserver | None = None,
    ) -> None:
        self.device = device
        self.device_id = device_id
        self.address = address
        self.servicer = P4RuntimeServicer(device, device_id, validate_config, api_version, observer)
        self._max_workers = max_workers  # each open stream holds one worker
        self._server: grpc.Server | None = None
        self.port = 0

    def start(self) -> int:
        """Bind and serve; returns the bound port (the OS picks it when the address ends in :0)."""
        if self._server is not None:
            raise RuntimeError("P4Runtime server already started")
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="p4rt"),
            options=GRPC_OPTIONS,
        )
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self.servicer, server)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise OSError(f"cannot bind the P4Runtime server to {self.address}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind the P4Runtime server to {self.address}")
        server.start()
        self._server, self.port = server, port
        log.info(
            "P4Runtime server for device %d on %s (port %d)", self.device_id, self.address, port
        )
        return port

    def stop(self, grace: float | None = None) -> None:
        """Stop serving: end the streams, then wait (up to `grace` s) for RPCs in flight."""
        server, self._server = self._server, None
        if server is None:
            return
        self.servicer.close()
        server.stop(grace).wait()
