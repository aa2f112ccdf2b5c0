"""A P4Runtime client for one switch (BMv2's simple_switch_grpc or the reference switch).

It keeps the StreamChannel open for the whole session (a background thread drains it
and notices when it is lost), sends its election id on every Write and pipeline push,
and encodes values canonically. Errors are exceptions, never exits.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2

from homagg.control.write_batch import WriteBatch
from homagg.p4rt.api import GRPC_OPTIONS, p4runtime_pb2, p4runtime_pb2_grpc
from homagg.p4rt.entities import (
    CounterData,
    CounterEntry,
    MatchValue,
    MulticastGroupEntry,
    TableEntry,
)
from homagg.p4rt.p4info import P4InfoIndex

__all__ = [
    "ArbitrationError",
    "P4RuntimeWriteError",
    "SwitchConnection",
    "SwitchError",
    "TableEntry",
    "UpdateError",
    "WriteBatch",
]

log = logging.getLogger(__name__)
Update = p4runtime_pb2.Update
PIPELINE_TIMEOUT = 60.0  # BMv2 may take a while to load a large JSON
# Updates per WriteRequest. A failing Write's per-update codes (which the install and the
# removal act on: ALREADY_EXISTS is retried as a modify, NOT_FOUND is already gone) come
# back in a trailer; the reference switch bounds it for stock clients and keeps every code
# up to ~150 failures, beyond that only a summary (homagg/refswitch/p4runtime_write.py). So no
# Write carries more updates than that: every failure keeps its code, whatever the batch.
MAX_UPDATES_PER_WRITE = 100


class SwitchError(Exception):
    """A failed P4Runtime call: `code` is the gRPC status code (None when no RPC was made)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class ArbitrationError(SwitchError):
    """The switch was unreachable, refused the stream, or made another client primary."""


class UpdateError:
    """One failed update of a Write: its index in the batch, canonical code name, message."""

    __slots__ = ("code", "index", "message")

    def __init__(self, index: int, code: str, message: str) -> None:
        self.index, self.code, self.message = index, code, message

    def __repr__(self) -> str:
        return f"UpdateError({self.index}, {self.code}, {self.message!r})"


class P4RuntimeWriteError(SwitchError):
    """A Write in which some updates failed; `errors` lists only the failed ones."""

    def __init__(self, errors: list[UpdateError], total: int, code: grpc.StatusCode | None) -> None:
        lines = "; ".join(f"#{e.index} {e.code}: {e.message}" for e in errors)
        super().__init__(f"{len(errors)} of {total} P4Runtime updates failed: {lines}", code)
        self.errors = errors

    @property
    def codes(self) -> list[str]:
        """The canonical code names of the failed updates, in batch order."""
        return [e.code for e in self.errors]


def _rpc_error(exc: grpc.RpcError) -> SwitchError:
    """Turn a gRPC error into SwitchError, or P4RuntimeWriteError when it carries p4.v1.Error
    details."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    message = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
    trailers = exc.trailing_metadata() if isinstance(exc, grpc.Call) else None
    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        errors, total = [], 0
        for i, packed in enumerate(status.details):
            err = p4runtime_pb2.Error()
            if not packed.Unpack(err):
                continue
            total += 1
            if err.canonical_code != code_pb2.OK:
                errors.append(UpdateError(i, code_pb2.Code.Name(err.canonical_code), err.message))
        if errors:
            return P4RuntimeWriteError(errors, total, code)
    name = code.name if code is not None else "UNKNOWN"
    return SwitchError(f"P4Runtime call failed with {name}: {message}", code)


class SwitchConnection:
    """One P4Runtime session with one switch: arbitration, pipeline, entries, groups, counters."""

    def __init__(
        self, address: str, device_id: int = 0, election_id: int = 1, timeout: float = 5.0
    ) -> None:
        self.address = address
        self.device_id = device_id
        self.election_id = election_id
        self.timeout = timeout
        self._p4info: P4InfoIndex | None = None
        self._channel: grpc.Channel | None = None
        self._stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self._requests: queue.Queue[p4runtime_pb2.StreamMessageRequest | None] = queue.Queue()
        self._stream: Any = None
        self._reader: threading.Thread | None = None
        self._arbitrated = threading.Event()
        self._alive = False
        self._closing = False
        self.is_primary = False
        self.primary_losses = 0  # times another client became primary during this session
        self.primary_election_id: int | None = None
        self.stream_error: str | None = None  # why the stream ended, if it did
        self.stream_errors: list[p4runtime_pb2.StreamError] = []  # StreamErrors the switch sent

    # -- session ----------------------------------------------------------------------

    def connect(self, *, require_primary: bool = True) -> None:
        """Open the channel and the stream and arbitrate; ArbitrationError unless primary.

        With require_primary=False a backup session is kept open (is_primary tells).
        """
        if self._channel is not None:
            raise SwitchError(f"already connected to {self.address}")
        self._closing, self.stream_error = False, None
        self._channel = grpc.insecure_channel(self.address, options=GRPC_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            self.close()
            raise ArbitrationError(
                f"switch {self.address} unreachable within {self.timeout} s"
            ) from None
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        self._requests = queue.Queue()
        self._arbitrated.clear()
        self._stream = self._stub.StreamChannel(self._request_iterator())
        self._alive = True
        self._reader = threading.Thread(
            target=self._drain, name=f"p4rt-{self.address}", daemon=True
        )
        self._reader.start()
        request = p4runtime_pb2.StreamMessageRequest()
        request.arbitration.device_id = self.device_id
        self._set_election_id(request.arbitration.election_id)
        self._requests.put(request)
        if not self._arbitrated.wait(self.timeout) or not self._alive:
            reason = self.stream_error or f"no arbitration reply within {self.timeout} s"
            self.close()
            raise ArbitrationError(f"arbitration with {self.address} failed: {reason}")
        if require_primary and not self.is_primary:
            primary = self.primary_election_id
            self.close()
            raise ArbitrationError(
                f"not primary on {self.address}: election id {self.election_id}, "
                f"primary has {primary}"
            )

    def close(self) -> None:
        """End the stream and close the channel (idempotent)."""
        self._closing = True
        self._requests.put(None)  # half-close: the switch then ends the stream itself
        reader = self._reader if self._reader is not threading.current_thread() else None
        if reader is not None:
            reader.join(min(self.timeout, 1.0))
        if self._stream is not None and (reader is None or reader.is_alive()):
            self._stream.cancel()  # the switch did not answer the half-close
            if reader is not None:
                reader.join(self.timeout)
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = self._stream = self._reader = None
        self._alive = self.is_primary = False

    def __enter__(self) -> SwitchConnection:
        if self._channel is None:
            self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def is_connected(self) -> bool:
        """True while the stream is open (False once the switch closed it or the link broke)."""
        return self._alive

    def _request_iterator(self) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def _drain(self) -> None:
        stream = self._stream
        try:
            for response in stream:
                kind = response.WhichOneof("update")
                if kind == "arbitration":
                    arb = response.arbitration
                    self.primary_election_id = (arb.election_id.high << 64) | arb.election_id.low
                    was_primary, self.is_primary = self.is_primary, arb.status.code == code_pb2.OK
                    if was_primary and not self.is_primary:
                        self.primary_losses += 1
                        log.warning(
                            "switch %s: no longer primary (election id %d is)",
                            self.address,
                            self.primary_election_id,
                        )
                    if arb.status.code not in (
                        code_pb2.OK,
                        code_pb2.ALREADY_EXISTS,
                        code_pb2.NOT_FOUND,
                    ):
                        self.stream_error = f"arbitration refused: {arb.status.message}"
                    self._arbitrated.set()
                elif kind == "error":
                    log.warning("switch %s stream error: %s", self.address, response.error.message)
                    self.stream_errors.append(response.error)
                else:
                    log.debug("switch %s sent an unexpected %s", self.address, kind)
            self.stream_error = self.stream_error or "stream closed by the switch"
        except grpc.RpcError as exc:
            if not self._closing:
                self.stream_error = (
                    f"{exc.code().name}: {exc.details()}"
                    if isinstance(exc, grpc.Call)
                    else str(exc)
                )
                log.warning(
                    "switch %s: P4Runtime stream lost (%s)", self.address, self.stream_error
                )
        finally:
            self._alive = False
            self.is_primary = False
            self._arbitrated.set()

    def _set_election_id(self, target: p4runtime_pb2.Uint128) -> None:
        target.high, target.low = self.election_id >> 64, self.election_id & (2**64 - 1)

    def _call(self, name: str, request: Any, timeout: float | None = None) -> Any:
        method = self._stub_method(name)
        try:
            return method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise _rpc_error(exc) from None

    # -- pipeline -------------------------------------------------------------------

    def capabilities(self) -> str:
        """The switch's P4Runtime API version."""
        return self._call("Capabilities", p4runtime_pb2.CapabilitiesRequest()).p4runtime_api_version

    def set_pipeline(self, p4info_path: Path, device_config_path: Path) -> None:
        """Push a P4Info (text format, or binary if named *.bin/*.pb) and device config (BMv2
        JSON)."""
        p4info_path = Path(p4info_path)
        if p4info_path.suffix in (".bin", ".pb"):
            index = P4InfoIndex.from_bytes(p4info_path.read_bytes())
        else:
            index = P4InfoIndex.from_text_file(p4info_path)
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        )
        self._set_election_id(request.election_id)
        request.config.p4info.CopyFrom(index.proto)
        request.config.p4_device_config = Path(device_config_path).read_bytes()
        self._call("SetForwardingPipelineConfig", request, max(self.timeout, PIPELINE_TIMEOUT))
        self._p4info = index

    def get_p4info(self) -> P4InfoIndex:
        """The P4Info the switch runs (GetForwardingPipelineConfig), cached for later calls."""
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE,
        )
        response = self._call("GetForwardingPipelineConfig", request)
        self._p4info = P4InfoIndex(response.config.p4info)
        return self._p4info

    @property
    def p4info(self) -> P4InfoIndex:
        """The P4Info in use: the one pushed, else fetched from the switch once."""
        return self._p4info if self._p4info is not None else self.get_p4info()

    def _stub_method(self, name: str) -> Any:
        if self._stub is None:
            raise SwitchError(f"not connected to {self.address}")
        return getattr(self._stub, name)

    # -- writes -----------------------------------------------------------------------

    def batch(self) -> WriteBatch:
        """A new, empty batch of updates for write_batch()."""
        return WriteBatch(self.p4info)

    def write_batch(self, updates: WriteBatch | Iterable[p4runtime_pb2.Update]) -> None:
        """Send the updates in order, in WriteRequests of at most MAX_UPDATES_PER_WRITE, every
        one of them even when one fails (as one Write would: CONTINUE_ON_ERROR);
        P4RuntimeWriteError lists the updates that failed by their index in `updates`, each
        with its code. Any other failure (the link) stops at once."""
        updates = list(updates)
        errors: list[UpdateError] = []
        code = None
        for start in range(0, len(updates), MAX_UPDATES_PER_WRITE):
            request = p4runtime_pb2.WriteRequest(device_id=self.device_id)
            self._set_election_id(request.election_id)
            request.updates.extend(updates[start : start + MAX_UPDATES_PER_WRITE])
            try:
                self._call("Write", request)
            except P4RuntimeWriteError as exc:
                errors += [UpdateError(start + e.index, e.code, e.message) for e in exc.errors]
                code = exc.code
        if errors:
            raise P4RuntimeWriteError(errors, len(updates), code)

    def insert_entry(
        self,
        table: str,
        match: Mapping[str, MatchValue],
        action: str,
        params: Mapping[str, int],
        priority: int = 0,
    ) -> None:
        """Add a table entry (match values: see homagg.p4rt.entities)."""
        self.write_batch(self.batch().insert_entry(table, match, action, params, priority))

    def modify_entry(
        self,
        table: str,
        match: Mapping[str, MatchValue],
        action: str,
        params: Mapping[str, int],
        priority: int = 0,
    ) -> None:
        """Change the action of a table entry."""
        self.write_batch(self.batch().modify_entry(table, match, action, params, priority))

    def delete_entry(self, table: str, match: Mapping[str, MatchValue], priority: int = 0) -> None:
        """Remove a table entry."""
        self.write_batch(self.batch().delete_entry(table, match, priority))

    def set_default_action(self, table: str, action: str, params: Mapping[str, int]) -> None:
        """Set the action a table takes on a miss."""
        self.write_batch(self.batch().set_default_action(table, action, params))

    def write_multicast_group(
        self, group_id: int, replicas: Sequence[tuple[int, int]], modify: bool = False
    ) -> None:
        """Create (or with modify=True replace) a multicast group of (port, instance) replicas."""
        kind = Update.MODIFY if modify else Update.INSERT
        self.write_batch(self.batch().multicast_group(kind, group_id, replicas))

    def delete_multicast_group(self, group_id: int) -> None:
        """Remove a multicast group."""
        self.write_batch(self.batch().multicast_group(Update.DELETE, group_id))

    def write_counter(self, name: str, index: int, packets: int = 0, nbytes: int = 0) -> None:
        """Set (by default: reset) one cell of an indirect counter."""
        self.write_batch(self.batch().write_counter(name, index, packets, nbytes))

    # -- reads ------------------------------------------------------------------------

    def _read(self, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=[entity])
        stub = self._stub_method("Read")
        try:
            return [
                e for response in stub(request, timeout=self.timeout) for e in response.entities
            ]
        except grpc.RpcError as exc:
            raise _rpc_error(exc) from None

    def read_entries(self, table: str | None = None) -> list[TableEntry]:
        """Every entry of one table, or of all tables (default entries not included)."""
        if table:
            entity = TableEntry(table).to_entity(self.p4info)
        else:
            entity = p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=0))
        return [TableEntry.from_proto(e.table_entry, self.p4info) for e in self._read(entity)]

    def read_default_action(self, table: str) -> TableEntry:
        """The default entry of a table (is_default is True; match is empty)."""
        found = self._read(TableEntry(table, is_default=True).to_entity(self.p4info))
        if len(found) != 1:
            raise SwitchError(f"expected one default entry for {table}, got {len(found)}")
        return TableEntry.from_proto(found[0].table_entry, self.p4info)

    def read_multicast_groups(self) -> dict[int, list[tuple[int, int]]]:
        """Every multicast group: id -> [(port, instance)]."""
        groups = (
            MulticastGroupEntry.from_proto(e.packet_replication_engine_entry.multicast_group_entry)
            for e in self._read(MulticastGroupEntry(0).to_entity())
        )
        return {g.group_id: list(g.replicas) for g in groups}

    def read_counter(self, name: str, index: int | None = None) -> dict[int, tuple[int, int]]:
        """An indirect counter's cells (all, or one): index -> (packets, bytes)."""
        cells: dict[int, tuple[int, int]] = {}
        for e in self._read(CounterEntry(name, index).to_entity(self.p4info)):
            cell = CounterEntry.from_proto(e.counter_entry, self.p4info)
            packets, nbytes = cell.data or CounterData(0, 0)
            cells[cell.index or 0] = (packets, nbytes)
        return cells

    def read_direct_counters(self, table: str) -> list[tuple[TableEntry, int, int]]:
        """Each entry of a table with its direct counter: (entry, packets, bytes)."""
        request = TableEntry(table, counter_data=CounterData(0, 0))  # asks for the counters
        out = []
        for e in self._read(request.to_entity(self.p4info)):
            entry = TableEntry.from_proto(e.table_entry, self.p4info)
            packets, nbytes = entry.counter_data or CounterData(0, 0)
            out.append((dataclasses.replace(entry, counter_data=None), packets, nbytes))
        return out
