"""The worker's transport to the switch: a self-clocked pool of slots in flight.

Chunk k of the job's stream carries the tag k mod P(S) and goes to slot tag mod S, shadow
copy (tag div S) mod 2, where S is the pool size and P(S) the numbering period
(worker/chunk_numbering.py); chunk k + S is sent only once chunk k's result is back
(SwitchML's pool rule, docs/protocol.md), so every worker numbers chunks alike as long as
all of them call `allreduce` with the same lengths in the same order (what the codecs
guarantee).
Lost packets are retransmitted after a timeout from measured round trips (RFC 6298,
worker/retransmission_timer.py) that doubles per try; duplicate, stray,
late and reordered results are recognised by job and chunk and ignored. A chunk that spent
its retry budget keeps waiting while the switch path and the peers are proven alive (a
slow rank is not a dead path, worker/straggler_wait.py). A local send error (a link down:
ENETUNREACH) is the switch path failing: a TransportError that names the cause.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np

from aggwire.constants import AGG_VERSION, CELLS_PER_PKT, Flag, Op
from aggwire.header import HEADER_DTYPE, marked_retx
from aggwire.packer import PAYLOAD_BYTES, pack_payloads, parse_payloads
from worker.channel import Channel
from worker.chunk_numbering import chunk_period, chunk_tags, shadow_of, slot_of, tag_offset
from worker.codecs.base import CodecError, Phase
from worker.retransmission_timer import RetransmissionTimer
from worker.straggler_wait import PeersProblem, StragglerWait


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
    dead_path_s: float = 3.0  # once the budget is spent: silence of the switch that ends a wait
    max_straggler_wait: float = 120.0  # once the budget is spent: the longest wait for a peer
    lane_ops: bool = True  # the switch adds ADD16 / ADD8 lanes (Assignment.lane_ops)


@dataclass
class TransportStats:
    """Counts and latencies since the transport was made."""

    chunks: int = 0
    packets_sent: int = 0
    retransmissions: int = 0
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
    ) -> None:
        """`peers_problem` ("" while every peer is alive, else why not; the agent's) lets a
        chunk that spent its retry budget wait for a slow peer; None: it fails at once."""
        self.period = chunk_period(config.pool_size)  # raises on a pool size out of range
        if first_chunk < 0:
            raise ValueError(f"first_chunk must be >= 0, not {first_chunk}")
        self.config = config
        self.channel = channel
        # The job-wide stream index of this worker's next chunk (unbounded; the wire tag is
        # derived from it modulo the numbering period).
        self.next_chunk = first_chunk
        self.stats = TransportStats()
        self.timer = RetransmissionTimer(
            initial=config.initial_timeout,
            minimum=min(config.min_timeout, config.initial_timeout),
            maximum=max(config.max_timeout, config.initial_timeout),
            adaptive=config.adaptive_timeout,
        )
        self.wait = StragglerWait(
            config.dead_path_s, config.max_straggler_wait, peers_problem=peers_problem
        )

    def allreduce(self, op: Op, cells: np.ndarray) -> np.ndarray:
        """The element-wise combination under op of every worker's `cells` (int32, 1-D)."""
        if op in (Op.ADD16, Op.ADD8) and not self.config.lane_ops:
            raise OpUnsupportedError(
                f"the switch of job {self.config.job_id} has no {Op(op).name} (its program drops "
                "16- and 8-bit lanes as BAD_OP): use a codec without lanes"
            )
        cells = np.ascontiguousarray(cells, np.int32).reshape(-1)
        n = cells.size
        count = max(1, -(-n // CELLS_PER_PKT))
        first = self.next_chunk
        self.next_chunk += count
        padded = np.zeros(count * CELLS_PER_PKT, np.int32)
        padded[:n] = cells
        payloads = self.pack_chunks(op, first, padded.reshape(count, CELLS_PER_PKT), n)
        out = np.empty(count * CELLS_PER_PKT, np.int32)
        self._exchange(first, payloads, out)
        self.stats.chunks += count
        return out[:n]

    def run(self, gen: Generator[Phase, np.ndarray, np.ndarray]) -> np.ndarray:
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
        count = cells.shape[0]
        headers = np.zeros(count, HEADER_DTYPE)
        headers["version"] = AGG_VERSION
        headers["op"] = int(op)
        headers["rank"] = cfg.rank
        headers["job_id"] = cfg.job_id
        tags = chunk_tags(first, count, cfg.pool_size)
        headers["chunk"] = tags
        headers["slot"] = slot_of(tags, cfg.pool_size)
        headers["shadow"] = shadow_of(tags, cfg.pool_size)
        headers["ncells"] = CELLS_PER_PKT
        headers["ncells"][-1] = n - (count - 1) * CELLS_PER_PKT if n else CELLS_PER_PKT
        return pack_payloads(headers, cells)

    def _exchange(self, first: int, payloads: np.ndarray, out: np.ndarray) -> None:
        """Keep up to `pool_size` chunks in flight until every result is in `out`."""
        cfg, stats = self.config, self.stats
        count = payloads.shape[0]
        sent_at = np.zeros(count)  # first send: round trips
        last_sent = np.zeros(count)  # last send: timeouts
        tries = np.zeros(count, np.int64)
        done = np.zeros(count, bool)
        next_to_send, remaining, timer = 0, count, self.timer
        while remaining:
            now = time.monotonic()
            # Self-clocking: chunk i goes once chunk i - pool_size is done (or of an earlier call).
            while next_to_send < count and (
                next_to_send < cfg.pool_size or done[next_to_send - cfg.pool_size]
            ):
                self._send(payloads[next_to_send].tobytes())
                sent_at[next_to_send] = last_sent[next_to_send] = now
                next_to_send += 1
            inflight = np.flatnonzero(~done[:next_to_send])
            # Deadlines follow the timer as it learns (and backs off), not the one at send time.
            deadline = last_sent[inflight] + timer.timeouts(tries[inflight])
            for i in inflight[deadline <= now]:
                if tries[i] >= cfg.max_retries:
                    self._wait_for_peers(first, int(inflight[0]), int(i), now - sent_at[i])
                elif tries[i] and (gone := self.wait.peers_gone()):
                    raise self._no_result(first + int(i), gone)  # no need to spend the budget
                tries[i] += 1
                self._send(marked_retx(payloads[i]))
                timer.timed_out(last_sent[i], now)  # once per expiry event, not per chunk
                last_sent[i] = now
                stats.retransmissions += 1
            deadline = last_sent[inflight] + timer.timeouts(tries[inflight])
            wait = max(0.0, float(deadline.min()) - time.monotonic()) if inflight.size else 0.0
            data = self.channel.recv(wait)
            while data is not None:
                i = self._accept(data, first, count, done, out)
                if i is not None:
                    done[i] = True
                    remaining -= 1
                    stats.results += 1
                    rtt = time.monotonic() - sent_at[i]
                    stats.latencies.append(rtt)
                    if not tries[i]:  # Karn: a retransmitted chunk's round trip is ambiguous
                        timer.sample(rtt)
                    self.wait.progressed(first + i, payloads[i])
                data = self.channel.recv(0.0)
        self.wait.keep_probe()

    def _wait_for_peers(self, first: int, oldest: int, i: int, waited: float) -> None:
        """Chunk first + i spent its retry budget: probe the path and keep waiting for a slow
        peer, or raise TransportError when the path or a peer is gone (straggler_wait.py)."""
        cfg, now = self.config, time.monotonic()
        probe = self.wait.probe_for(first + oldest, cfg.pool_size)
        reason = self.wait.stop_reason(now, waited, probe is not None)
        if reason:
            raise self._no_result(first + i, f"{cfg.max_retries} retransmissions, then {reason}")
        if probe is not None and self.wait.should_probe(now, cfg.max_timeout / 2):
            self._send(probe)

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
            name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
            cause = f"{name}: {exc.strerror}" if name else str(exc)
            raise TransportError(
                f"cannot send to the switch of job {self.config.job_id} ({cause}): "
                "the switch path failed at this host (a link or route down?)"
            ) from exc
        self.stats.packets_sent += 1

    def _accept(
        self, data: bytes, first: int, count: int, done: np.ndarray, out: np.ndarray
    ) -> int | None:
        """Place a result; returns its index in this call, or None for anything to ignore."""
        self.wait.heard(time.monotonic())
        if len(data) != PAYLOAD_BYTES:
            self.stats.ignored += 1
            return None
        headers, cells = parse_payloads(data)
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
        out[i * CELLS_PER_PKT : (i + 1) * CELLS_PER_PKT] = cells[0]
        return i
