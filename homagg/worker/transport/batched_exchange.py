"""The transport's batched path: one call's chunks through the switch batch by batch.

Every chunk the pool rule and the congestion window let go leaves in one `send_many` (one
sendmmsg on a UDP channel); every look at the socket takes what is waiting in one
`recv_many` (one recvmmsg) and parses, checks and places the whole batch with numpy; the
clock is read and the retransmission timer sampled once per batch, not per datagram, and
the chunks' own timers are worked out only once a cheap bound (the earliest last send plus a
first try's timeout) says that one may have run out. The
rules are the per-datagram path's (homagg/worker/transport/switch_transport.py, the
reference): the pool rule, the congestion window (grown by a batch's answers at once), the
timers and their expiry (`SwitchTransport._expired`, shared), Karn's rule, the resends
proven lost by a resent result and the fast resend of chunks passed over, the straggler
wait. Per batch, one round trip sample: the largest of the batch's chunks sent once (a
batch's results left the switch within one wait, so its largest round trip is the one a
timeout must cover).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from homagg.wire.constants import AGG_HEADER_BYTES, Flag
from homagg.wire.header import HEADER_DTYPE, header_view
from homagg.wire.packer import CELLS_DTYPE
from homagg.worker.transport.channel import MMSG_BATCH, recv_many, send_many
from homagg.worker.transport.flight import MAX_DRAIN, Flight

if TYPE_CHECKING:
    from homagg.worker.transport.switch_transport import SwitchTransport


class BatchedExchange:
    """One `allreduce` call's exchange: `payloads` (k packed chunks, stream indices first ..
    first + k - 1) until every result is in `out` (k x cells_per_packet int32 cells)."""

    def __init__(
        self, transport: SwitchTransport, first: int, payloads: np.ndarray, out: np.ndarray
    ) -> None:
        self.t = transport
        self.first, self.payloads = first, payloads
        cfg = transport.config
        self.cells = out.reshape(-1, cfg.cells_per_packet)
        self.flight = Flight(payloads.shape[0], restarts=transport.timer.adaptive)
        self.first_tag = first % transport.period
        self.row_bytes = transport.payload_size + 1  # a longer datagram shows as longer

    def run(self) -> None:
        """Send, receive and resend until every chunk is answered (TransportError when the
        switch path or a peer fails, as on the per-datagram path)."""
        t, flight = self.t, self.flight
        t._exchanging = self.first
        t.coalescing.started()
        while flight.remaining:
            ready = flight.sendable(t.config.pool_size, t.window.limit)
            if ready:
                start = flight.next_to_send
                self._send(self.payloads[start : start + ready])
                flight.sent_many(start, start + ready, t.clock())
            now = t.clock()
            deadline = flight.deadline_bound(t.timer)  # the timers themselves only near it
            if deadline <= now and (deadline := flight.next_deadline(t.timer)) <= now:
                # Results that came meanwhile first: a late look at the socket is not a loss.
                if self._drain(0.0):
                    continue
                expired = t._expired(self.first, flight, now)
                if expired:
                    self._resend(np.asarray(expired, np.int64), now)
                deadline = flight.next_deadline(t.timer)
            wait = max(0.0, deadline - t.clock()) if flight.in_flight else 0.0
            nap = t.coalescing.nap(flight.in_flight, wait)
            if nap > 0:  # results trickle in: let a batch gather (result_coalescing.py)
                t.coalescing.sleep(nap)
                wait = max(0.0, wait - nap)
            self._drain(wait)
        t.wait.keep_probe()

    def _send(self, rows: np.ndarray) -> None:
        """Datagrams to the switch; a local send error is the switch path failing."""
        try:
            send_many(self.t.channel, rows)
        except OSError as exc:
            raise self.t._send_failed(exc) from exc
        self.t.stats.packets_sent += rows.shape[0]

    def _resend(self, idx: np.ndarray, now: float) -> None:
        """Retransmit chunks `idx` (distinct), marked RETX, in one batch."""
        rows = self.payloads[idx]  # a copy
        header_view(rows)["flags"] |= int(Flag.RETX)
        self._send(rows)
        self.flight.resent_many(idx, now)
        self.t.stats.retransmissions += idx.size

    def _drain(self, wait: float) -> int:
        """Take the datagrams that arrive within `wait` s and then without waiting, at most
        about MAX_DRAIN; returns how many were results of this call."""
        taken = seen = 0
        rows, lengths = recv_many(self.t.channel, wait, self.row_bytes)
        while lengths.size:
            seen += lengths.size
            taken += self._receive(rows, lengths)
            # A batch short of a full one left the socket empty (strays aside): the next
            # look, a poll, finds what comes next without an empty receive before it.
            if seen >= MAX_DRAIN or not self.flight.remaining or lengths.size < MMSG_BATCH:
                break
            rows, lengths = recv_many(self.t.channel, 0.0, self.row_bytes)
        return taken

    def _receive(self, rows: np.ndarray, lengths: np.ndarray) -> int:
        """Place a batch of datagrams' results; returns how many were results of this call.
        Stray, late (an earlier call), duplicate and malformed ones are counted ignored."""
        t, flight, cfg = self.t, self.flight, self.t.config
        now = t.clock()
        t.wait.heard(now)
        idx, pos = self._accepted(rows, lengths)
        t.coalescing.found(int(idx.size), now)
        t.stats.ignored += lengths.size - idx.size
        if not idx.size:
            return 0
        cells = rows[pos, AGG_HEADER_BYTES : AGG_HEADER_BYTES + 4 * cfg.cells_per_packet]
        self.cells[idx] = cells.view(CELLS_DTYPE)
        t.stats.results += idx.size
        rtt = now - flight.sent_at[idx]
        t.stats.latencies.extend(rtt.tolist())
        once = flight.tries[idx] == 0  # Karn: a retransmitted chunk's round trip is ambiguous
        if once.any():
            t.timer.sample(float(rtt[once].max()))
        flight.answered_many(idx, now)
        t.window.answered(int(idx.size))
        newest = int(idx[-1])
        t.wait.progressed(self.first + newest, self.payloads[newest])
        resent = (rows[pos, 1] & int(Flag.RETX)) != 0  # the flags byte
        lost = self._proven_lost(idx[resent & ~once], newest)
        if lost.size:
            self._resend(lost, now)
        return int(idx.size)

    def _accepted(self, rows: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The results of this call's open chunks in the batch: (chunk indices in this call,
        ascending and distinct; their rows in the batch)."""
        t, cfg = self.t, self.t.config
        headers = rows[:, :AGG_HEADER_BYTES].view(HEADER_DTYPE)[:, 0]
        tags = headers["chunk"].astype(np.int64)
        idx = (tags - self.first_tag) % t.period
        ok = (
            (lengths == t.payload_size)
            & (tags < t.period)
            & ((headers["flags"] & int(Flag.RESULT)) != 0)
            & (headers["job_id"] == cfg.job_id)
            & (headers["rank"] == cfg.rank)
            & (idx < self.flight.count)
        )
        pos = np.flatnonzero(ok)
        pos = pos[~self.flight.done[idx[pos]]]
        chunks = idx[pos]
        if chunks.size > 1 and not (chunks[1:] > chunks[:-1]).all():  # not in order: sort
            chunks, first_seen = np.unique(chunks, return_index=True)  # a duplicate once
            pos = pos[first_seen]
        return chunks, pos

    def _proven_lost(self, answered_resends: np.ndarray, newest: int) -> np.ndarray:
        """The open chunks that this batch's answers prove lost: those last sent before the
        first resend of a chunk whose resend was answered (the switch answers in order), and
        those sent once that `fast_resend_after` later chunks overtook (fast resend)."""
        flight, after = self.flight, self.t.config.fast_resend_after
        if not flight.restarts:
            return np.zeros(0, np.int64)
        lost = [flight.lost_before(int(i)) for i in answered_resends]
        if after and newest > flight.oldest:  # an open chunk before the newest answered
            passed = flight.passed_over(newest, after)
            for j in passed:  # a loss for the congestion window (fast retransmit)
                self.t.window.lost(self.first + int(j), self.first + flight.next_to_send)
            lost.append(passed)
        return np.unique(np.concatenate(lost)) if lost else np.zeros(0, np.int64)
