"""The worker's transport to the switch: a self-clocked pool of slots in flight.

Chunk k of the job's stream carries the tag k mod P(S) and goes to slot tag mod S, shadow
copy (tag div S) mod 2, where S is the pool size and P(S) the numbering period
(homagg/worker/transport/chunk_numbering.py); chunk k + S is sent only once chunk k's
result is back (SwitchML's pool rule, docs/protocol.md), so every worker numbers chunks
alike as long as all of them call `allreduce` with the same lengths in the same order
(what the codecs guarantee). Below the pool, at most min(S, the congestion window) chunks
are in flight (homagg/worker/transport/congestion_window.py: slow start, additive
increase, halved on a loss); the window paces, it never changes a chunk's number.
Lost packets are retransmitted after a timeout from measured round trips (RFC 6298,
homagg/worker/transport/retransmission_timer.py) that doubles per try. As with RFC 6298's
one timer, an answer restarts the timers of the chunks behind it and an expiry resends only
the earliest chunk and restarts the others (`Flight`, homagg/worker/transport/flight.py): a
pool that is late (queued in the switch, or waiting for a slower rank) costs one resend per
doubling, not the whole pool per expiry; the resend's answer, which the switch sends after
every chunk sent before it, proves those still unanswered lost, and they go at once. A
chunk sent once that three later chunks overtook was lost too and goes at once, without
waiting for its timeout (fast retransmit).
Duplicate, stray, late and reordered results are recognised by job and chunk and ignored.
A chunk that spent its retry budget keeps waiting while the switch path and the peers are
proven alive (a slow rank is not a dead path, homagg/worker/transport/straggler_wait.py). A
local send error (a link down: ENETUNREACH) is the switch path failing: a TransportError
that names the cause.
A rank that gives up a call for a reason of its own tells the others (`tell`), who stop
waiting on it when they learn it (`told`); setting `next_chunk` (the ranks realigning their
counters after a fallback) starts a new alignment, to which older give-ups do not apply.
Two I/O paths take the same rules (homagg/worker/transport/io_path.py): batched (whole
batches per system call, parsed with numpy: homagg/worker/transport/batched_exchange.py; the
default) and one datagram at a time (below: the reference).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from homagg.control.job_record import GaveUp
from homagg.wire.constants import (
    AGG_VERSION,
    CELLS_CHOICES,
    CELLS_PER_PKT,
    Flag,
    Op,
    agg_frame_bytes,
)
from homagg.wire.header import HEADER_DTYPE, marked_retx
from homagg.wire.packer import pack_payloads, parse_payloads, payload_bytes
from homagg.worker.codecs.base import CodecError, Phase
from homagg.worker.transport.batched_exchange import BatchedExchange
from homagg.worker.transport.channel import Channel
from homagg.worker.transport.chunk_numbering import (
    chunk_period,
    chunk_tags,
    shadow_of,
    slot_of,
    tag_offset,
)
from homagg.worker.transport.congestion_window import (
    CongestionWindow,
    resolve_congestion_window,
)
from homagg.worker.transport.flight import MAX_DRAIN, Flight
from homagg.worker.transport.io_path import BATCHED, resolve_io_path
from homagg.worker.transport.result_coalescing import ResultCoalescing
from homagg.worker.transport.retransmission_timer import RetransmissionTimer
from homagg.worker.transport.straggler_wait import PeersProblem, StragglerWait, Tell, Told

Returned = TypeVar("Returned")  # what a phase generator returns (a sum, a list of sums)


class TransportError(RuntimeError):
    """The switch path failed: no result within the budget, a dead peer or path, or a local
    send error (the caller falls back)."""


class OpUnsupportedError(CodecError):
    """The switch's program lacks the op the codec asked for (the assignment says so):
    nothing was sent; the codec cannot run on this switch."""


@dataclass(frozen=True)
class TransportConfig:
    """What a worker needs to aggregate through the switch (from the controller's assignment)."""

    job_id: int
    rank: int
    world_size: int
    pool_size: int  # slots of the job's pool: chunks in flight
    initial_timeout: float = 0.02  # before the first measured round trip
    max_timeout: float = 0.5
    min_timeout: float = 0.005  # the measured timeout's floor
    adaptive_timeout: bool = True  # False: initial_timeout always (the former behaviour)
    max_retries: int = 12
    # A chunk sent once is resent as soon as this many chunks sent after it were answered
    # (the switch answers in order: it was lost; RFC 5681's fast retransmit); 0: timeouts only.
    # With the measured timer only (adaptive_timeout).
    fast_resend_after: int = 3
    dead_path_s: float = 3.0  # once the budget is spent: silence of the switch that ends a wait
    max_straggler_wait: float = 120.0  # once the budget is spent: the longest wait for a peer
    lane_ops: bool = True  # the switch adds ADD16 / ADD8 lanes (Assignment.lane_ops)
    cells_per_packet: int = CELLS_PER_PKT  # the switch's program's (Assignment.cells_per_packet)
    # "batched" or "python" (homagg/worker/transport/io_path.py); "": HOMAGG_TRANSPORT_IO,
    # else batched
    io_path: str = ""
    # the congestion window below the pool (homagg/worker/transport/congestion_window.py);
    # None: HOMAGG_CONGESTION_WINDOW, else on
    congestion_window: bool | None = None
    # the batched path waits for results that trickle in to gather into batches
    # (homagg/worker/transport/result_coalescing.py); False: it looks at every one at once
    # (as the per-datagram path does: the tests that compare the two paths step by step)
    coalesce_results: bool = True

    @property
    def frame_bytes(self) -> int:
        """One aggregation packet on the wire (Ethernet frame, no FCS)."""
        return agg_frame_bytes(self.cells_per_packet)


@dataclass
class TransportStats:
    """Counts and latencies since the transport was made."""

    chunks: int = 0
    packets_sent: int = 0
    retransmissions: int = 0
    timeouts: int = 0  # retransmissions on a timer's expiry (the rest: proven lost earlier)
    cwnd: int = 0  # the congestion window after the last call (chunks; the pool when off)
    cwnd_halvings: int = 0  # retransmission timeouts that halved it
    results: int = 0
    ignored: int = 0
    latencies: list[float] = field(default_factory=list)
    # Time of run(): in the codec up to its last phase (encode), in the switch exchanges
    # (packing, sending, waiting, parsing), and in the codec after the last result (decode).
    encode_seconds: float = 0.0
    exchange_seconds: float = 0.0
    decode_seconds: float = 0.0

    def latency_percentiles(self) -> dict[str, float]:
        """p50/p99 of chunk round-trip times in milliseconds (first send to result)."""
        if not self.latencies:
            return {}
        lat = np.asarray(self.latencies) * 1e3
        return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


class SwitchTransport:
    """All-reduce of int32 cells through the switch under one op, chunk by chunk."""

    def __init__(
        self,
        config: TransportConfig,
        channel: Channel,
        first_chunk: int = 0,
        peers_problem: PeersProblem | None = None,
        peers_unproven: PeersProblem | None = None,
        told: Told | None = None,
        tell: Tell | None = None,
    ) -> None:
        """`peers_problem` ("" while every peer is alive, else why not; the agent's) lets a
        chunk that spent its retry budget wait for a slow peer; None: it fails at once.
        `peers_unproven` (the agent's: "" while the controller vouched for the peers
        recently enough) bounds that wait during a controller outage. `told` (the newest
        give-up of another rank) ends a wait on its call or a later one; `tell` tells the
        others this rank gave up a call (both the agent's, through the controller)."""
        self.period = chunk_period(config.pool_size)  # raises on a pool size out of range
        if config.cells_per_packet not in CELLS_CHOICES:
            raise ValueError(
                f"cells_per_packet {config.cells_per_packet} is none of {CELLS_CHOICES}"
            )
        if first_chunk < 0:
            raise ValueError(f"first_chunk must be >= 0, not {first_chunk}")
        self.io_path = resolve_io_path(config.io_path)  # raises on an unknown path
        self.config = config
        self.payload_size = payload_bytes(config.cells_per_packet)  # a result's, exactly
        self.channel = channel
        self.tell = tell
        self._next_chunk = first_chunk
        self._exchanging = first_chunk  # the first chunk of the call in progress (or last)
        self.window = CongestionWindow(
            config.pool_size, enabled=resolve_congestion_window(config.congestion_window)
        )
        self.stats = TransportStats(cwnd=self.window.limit)
        # the batched path's looks at the socket (a batch of 0: never a wait)
        self.coalescing = ResultCoalescing() if config.coalesce_results else ResultCoalescing(0)
        self.timer = RetransmissionTimer(
            initial=config.initial_timeout,
            minimum=min(config.min_timeout, config.initial_timeout),
            maximum=max(config.max_timeout, config.initial_timeout),
            adaptive=config.adaptive_timeout,
        )
        self.wait = StragglerWait(
            config.dead_path_s,
            config.max_straggler_wait,
            peers_problem=peers_problem,
            peers_unproven=peers_unproven,
            told=told,
            aligned_from=first_chunk,
        )

    @property
    def next_chunk(self) -> int:
        """The job-wide stream index of this worker's next chunk (unbounded; the wire tag is
        derived from it modulo the numbering period)."""
        return self._next_chunk

    @next_chunk.setter
    def next_chunk(self, chunk: int) -> None:
        """Resume at `chunk`, the counter the ranks agreed on (after a fallback): a new
        alignment, to which the give-ups told before do not apply."""
        self._next_chunk = self.wait.aligned_from = chunk
        self.window.realigned(chunk)

    def allreduce(self, op: Op, cells: np.ndarray) -> np.ndarray:
        """The element-wise combination under op of every worker's `cells` (int32, 1-D)."""
        if op in (Op.ADD16, Op.ADD8) and not self.config.lane_ops:
            raise OpUnsupportedError(
                f"the switch of job {self.config.job_id} has no {Op(op).name} (its program drops "
                "16- and 8-bit lanes as BAD_OP): use a codec without lanes"
            )
        cells = np.ascontiguousarray(cells, np.int32).reshape(-1)
        n, per = cells.size, self.config.cells_per_packet
        count = max(1, -(-n // per))
        first = self._next_chunk
        self._next_chunk += count
        padded = np.zeros(count * per, np.int32)
        padded[:n] = cells
        payloads = self.pack_chunks(op, first, padded.reshape(count, per), n)
        out = np.empty(count * per, np.int32)
        self._exchange(first, payloads, out)
        self.stats.chunks += count
        return out[:n]

    def run(self, gen: Generator[Phase, np.ndarray, Returned]) -> Returned:
        """Drive a codec's phase generator through the switch; returns what it returns."""
        stats, mark = self.stats, time.perf_counter()
        try:
            phase = next(gen)
            while True:
                sent = time.perf_counter()
                stats.encode_seconds += sent - mark
                summed = self.allreduce(phase.op, phase.cells)
                mark = time.perf_counter()
                stats.exchange_seconds += mark - sent
                phase = gen.send(summed)
        except StopIteration as done:
            stats.decode_seconds += time.perf_counter() - mark
            return done.value

    def pack_chunks(self, op: Op, first: int, cells: np.ndarray, n: int) -> np.ndarray:
        """The payloads of chunks first, first+1, ... carrying rows of `cells` (n valid in all)."""
        cfg = self.config
        count, per = cells.shape[0], cfg.cells_per_packet
        headers = np.zeros(count, HEADER_DTYPE)
        headers["version"] = AGG_VERSION
        headers["op"] = int(op)
        headers["rank"] = cfg.rank
        headers["job_id"] = cfg.job_id
        tags = chunk_tags(first, count, cfg.pool_size)
        headers["chunk"] = tags
        headers["slot"] = slot_of(tags, cfg.pool_size)
        headers["shadow"] = shadow_of(tags, cfg.pool_size)
        headers["ncells"] = per
        headers["ncells"][-1] = n - (count - 1) * per if n else per
        return pack_payloads(headers, cells)

    def _exchange(self, first: int, payloads: np.ndarray, out: np.ndarray) -> None:
        """Keep up to min(`pool_size`, the window) chunks in flight until every result is in
        `out`: batch by batch, or on the per-datagram path (the reference) datagram by
        datagram."""
        try:
            if self.io_path == BATCHED:
                BatchedExchange(self, first, payloads, out).run()
            else:
                self._exchange_datagrams(first, payloads, out)
        finally:
            self.stats.cwnd, self.stats.cwnd_halvings = self.window.limit, self.window.halvings

    def _exchange_datagrams(self, first: int, payloads: np.ndarray, out: np.ndarray) -> None:
        """`_exchange` one datagram at a time (the reference path)."""
        cfg, timer, window = self.config, self.timer, self.window
        flight = Flight(payloads.shape[0], restarts=timer.adaptive)
        self._exchanging = first
        while flight.remaining:
            now = time.monotonic()
            # Self-clocking: chunk i goes once chunk i - pool_size is done (or of an earlier
            # call) and fewer than the window's chunks are in flight.
            while flight.may_send(cfg.pool_size, window.limit):
                self._send(payloads[flight.next_to_send].tobytes())
                flight.sent(flight.next_to_send, now)
                flight.next_to_send += 1
            # Results that came meanwhile first: a late look at the socket is not a loss.
            if self._drain(0.0, first, payloads, flight, out):
                continue
            now = time.monotonic()
            for i in self._expired(first, flight, now):
                self._resend(payloads, flight, int(i), now)
            inflight, _, deadline = flight.deadlines(timer)
            wait = max(0.0, float(deadline.min()) - time.monotonic()) if inflight.size else 0.0
            self._drain(wait, first, payloads, flight, out)
        self.wait.keep_probe()

    def _expired(self, first: int, flight: Flight, now: float) -> list[int]:
        """The chunks to resend at `now` because their timers expired (backing the timer off
        once per expiry event); a chunk past its retry budget waits for a slow peer or
        raises TransportError (`_wait_for_peers`)."""
        cfg, timer = self.config, self.timer
        inflight, start, deadline = flight.deadlines(timer)
        expired = np.flatnonzero(deadline <= now)
        skipped = start < flight.last_answer  # a later answer since: a loss, not silence
        if flight.restarts:
            expired = flight.probe_if_silent(expired, inflight, start, now)
        out = []
        for k in expired:
            i = inflight[k]
            if flight.tries[i] >= cfg.max_retries:
                self._wait_for_peers(first, int(inflight[0]), int(i), now - flight.sent_at[i])
            elif flight.tries[i] and (gone := self.wait.peers_gone()):
                raise self._no_result(first + int(i), gone)  # no need to spend the budget
            timer.timed_out(start[k], now)  # once per expiry event
            if skipped[k]:
                self.window.lost(first + int(i), first + flight.next_to_send)  # once a window
            out.append(int(i))
        self.stats.timeouts += len(out)
        return out

    def clock(self) -> float:
        """Monotonic seconds: the transport's one clock (tests replace it)."""
        return time.monotonic()

    def _drain(
        self, wait: float, first: int, payloads: np.ndarray, flight: Flight, out: np.ndarray
    ) -> int:
        """Take the datagrams that arrive within `wait` s and then without waiting, at most
        MAX_DRAIN; returns how many were results of this call (neither a flood of datagrams
        nor stray ones may hold the timers back)."""
        taken, data = 0, self.channel.recv(wait)
        for _ in range(MAX_DRAIN):
            if data is None:
                break
            taken += self._receive(data, first, payloads, flight, out)
            data = self.channel.recv(0.0)
        return taken

    def _receive(
        self, data: bytes, first: int, payloads: np.ndarray, flight: Flight, out: np.ndarray
    ) -> bool:
        """Place a result (False: nothing to place); a resent result that answers a chunk's
        resend proves the chunks sent before its first resend lost (the switch answers in
        order): resend them now."""
        accepted = self._accept(data, first, flight.count, flight.done, out)
        if accepted is None:
            return False
        i, resent = accepted
        now = time.monotonic()
        self.stats.results += 1
        rtt = now - flight.sent_at[i]
        self.stats.latencies.append(rtt)
        if not flight.tries[i]:  # Karn: a retransmitted chunk's round trip is ambiguous
            self.timer.sample(rtt)
        flight.answered(i, now)
        self.window.answered()
        self.wait.progressed(first + i, payloads[i])
        if resent and flight.restarts and flight.tries[i]:
            for j in flight.lost_before(i):
                self._resend(payloads, flight, int(j), now)
        after = self.config.fast_resend_after
        if flight.restarts and after and i > flight.oldest:  # an open chunk before this one
            for j in flight.passed_over(i, after):
                self.window.lost(first + int(j), first + flight.next_to_send)
                self._resend(payloads, flight, int(j), now)
        return True

    def _resend(self, payloads: np.ndarray, flight: Flight, i: int, now: float) -> None:
        """Retransmit chunk i (marked RETX)."""
        self._send(marked_retx(payloads[i]))
        flight.resent(i, now)
        self.stats.retransmissions += 1

    def _wait_for_peers(self, first: int, oldest: int, i: int, waited: float) -> None:
        """Chunk first + i spent its retry budget: probe the path and keep waiting for a slow
        peer, or raise TransportError when the path or a peer is gone (straggler_wait.py)."""
        cfg, now = self.config, time.monotonic()
        gone = self.wait.peers_gone()
        if gone:
            raise self._no_result(first + i, f"{cfg.max_retries} retransmissions, then {gone}")
        probe = self.wait.probe_for(first + oldest, cfg.pool_size)
        reason = self.wait.stop_reason(now, waited, probe is not None)
        if reason:
            error = self._no_result(first + i, f"{cfg.max_retries} retransmissions, then {reason}")
            raise self._give_up(error)
        if probe is not None and self.wait.should_probe(now, cfg.max_timeout / 2):
            self._send(probe)

    def _give_up(self, error: TransportError) -> TransportError:
        """`error`, after telling the other ranks that this one gave up the call in progress
        (they cannot complete it without this rank)."""
        if self.tell is not None:
            self.tell(GaveUp(self.config.rank, self._exchanging, str(error)))
        return error

    def _no_result(self, index: int, reason: str) -> TransportError:
        """The error for chunk `index` (stream index) that will not complete."""
        return TransportError(
            f"no result for chunk {index} (tag {index % self.period}) of job "
            f"{self.config.job_id}: {reason}"
        )

    def _send(self, payload: bytes) -> None:
        """One datagram to the switch; a local send error is the switch path failing."""
        try:
            self.channel.send(payload)
        except OSError as exc:
            raise self._send_failed(exc) from exc
        self.stats.packets_sent += 1

    def _send_failed(self, exc: OSError) -> TransportError:
        """The error of a local send error (after telling the other ranks)."""
        name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        cause = f"{name}: {exc.strerror}" if name else str(exc)
        return self._give_up(
            TransportError(
                f"cannot send to the switch of job {self.config.job_id} ({cause}): "
                "the switch path failed at this host (a link or route down?)"
            )
        )

    def _accept(
        self, data: bytes, first: int, count: int, done: np.ndarray, out: np.ndarray
    ) -> tuple[int, bool] | None:
        """Place a result: (its index in this call, whether the switch marked it resent), or
        None for anything to ignore."""
        self.wait.heard(time.monotonic())
        per = self.config.cells_per_packet
        if len(data) != self.payload_size:
            self.stats.ignored += 1
            return None
        headers, cells = parse_payloads(data, per)
        h = headers[0]
        tag = int(h["chunk"])
        i = tag_offset(tag, first % self.period, self.config.pool_size)
        if (
            tag >= self.period
            or not int(h["flags"]) & Flag.RESULT
            or int(h["job_id"]) != self.config.job_id
            or int(h["rank"]) != self.config.rank
            or i >= count
            or done[i]
        ):
            self.stats.ignored += 1  # stray, late (an earlier call) or duplicate
            return None
        out[i * per : (i + 1) * per] = cells[0]
        return i, bool(int(h["flags"]) & Flag.RETX)
