"""The chunks of one transport call in flight: when each was sent, resent and answered, and
when each one's retransmission timer started (RFC 6298's timer, per chunk). The per-datagram
path updates it chunk by chunk; the batched path (homagg/worker/transport/batched_exchange.py)
a batch of chunks at once with the same rules."""

from __future__ import annotations

import math

import numpy as np

from homagg.worker.transport.retransmission_timer import RetransmissionTimer

MAX_DRAIN = 512  # datagrams taken per look at the socket before the timers are checked


class Flight:
    """The chunks of one call: when each was sent, resent and answered, and when each one's
    retransmission timer started.

    With `restarts` (the measured timer) a chunk's timer follows RFC 6298 section 5 as one
    TCP timer would: it (re)starts at the chunk's last send and at the answer of any chunk
    sent before it (5.3: while the switch answers the chunks ahead of it, it is queued, not
    lost). A chunk skipped over (a later chunk answered since its last send) was lost, or
    its round waits for a peer: its timer runs from its last send, and it is resent when it
    expires, whatever else does. Chunks that expire in silence (nothing answered since
    their timers started: the switch is slow or a peer late, or everything was lost) are one
    event: the earliest is resent and the timers of every silent chunk restart (5.4-5.6),
    so a late pool costs one resend per doubling, not every chunk's. Without `restarts`, a
    chunk's timer runs from its last send and every expired chunk is resent (the former
    behaviour).
    """

    def __init__(self, count: int, restarts: bool) -> None:
        self.count, self.restarts = count, restarts
        self.sent_at = np.zeros(count)  # first send: round trips
        self.last_sent = np.zeros(count)
        self.first_resent = np.full(count, np.inf)
        self.restarted_at = np.full(count, -np.inf)
        self.answered_at = np.full(count, -np.inf)
        self.last_answer = -np.inf
        self.tries = np.zeros(count, np.int64)
        self.done = np.zeros(count, bool)
        self.next_to_send = 0
        self.remaining = count
        self.oldest = 0  # every chunk before it is done
        self.answered_before_oldest = -np.inf

    def sent(self, i: int, now: float) -> None:
        """Chunk i went out for the first time."""
        self.sent_at[i] = self.last_sent[i] = now

    def resent(self, i: int, now: float) -> None:
        """Chunk i went out again."""
        self.tries[i] += 1
        self.last_sent[i] = now
        self.first_resent[i] = min(self.first_resent[i], now)

    def answered(self, i: int, now: float) -> None:
        """Chunk i's result came."""
        self.done[i] = True
        self.remaining -= 1
        self.answered_at[i] = self.last_answer = now
        while self.oldest < self.next_to_send and self.done[self.oldest]:
            self.answered_before_oldest = max(
                self.answered_before_oldest, self.answered_at[self.oldest]
            )
            self.oldest += 1

    @property
    def in_flight(self) -> int:
        """Chunks sent and not answered yet (lost ones included, until they are answered)."""
        return self.next_to_send - (self.count - self.remaining)

    def may_send(self, pool_size: int, window: int) -> bool:
        """Whether chunk `next_to_send` may go now: the pool rule (chunk i goes once chunk
        i - pool_size is done) and fewer than `window` chunks in flight."""
        i = self.next_to_send
        return (
            i < self.count
            and self.in_flight < window
            and (i < pool_size or bool(self.done[i - pool_size]))
        )

    def sendable(self, pool_size: int, window: int) -> int:
        """How many chunks from `next_to_send` on may go now, together: those the pool rule
        lets go (chunk i once chunk i - pool_size is done; chunks below pool_size at once),
        at most `window` in flight."""
        start = self.next_to_send
        room = max(0, window - self.in_flight)
        free = max(0, min(pool_size, self.count) - start)  # the pool's first chunks
        begin = start + free
        if begin >= self.count:
            return min(room, self.count - start)
        blocked = ~self.done[begin - pool_size : self.count - pool_size]
        stop = int(np.argmax(blocked)) if blocked.any() else blocked.size
        return min(room, free + stop)

    def sent_many(self, start: int, stop: int, now: float) -> None:
        """Chunks start .. stop - 1 went out for the first time, together."""
        self.sent_at[start:stop] = self.last_sent[start:stop] = now
        self.next_to_send = max(self.next_to_send, stop)

    def resent_many(self, idx: np.ndarray, now: float) -> None:
        """Chunks `idx` (distinct) went out again, together."""
        self.tries[idx] += 1
        self.last_sent[idx] = now
        self.first_resent[idx] = np.minimum(self.first_resent[idx], now)

    def answered_many(self, idx: np.ndarray, now: float) -> None:
        """The results of chunks `idx` (distinct, open) came in one batch."""
        self.done[idx] = True
        self.remaining -= idx.size
        self.answered_at[idx] = self.last_answer = now
        open_ = ~self.done[self.oldest : self.next_to_send]
        oldest = self.oldest + (int(np.argmax(open_)) if open_.any() else open_.size)
        if oldest > self.oldest:
            self.answered_before_oldest = max(
                self.answered_before_oldest, float(self.answered_at[self.oldest : oldest].max())
            )
            self.oldest = oldest

    def starts(self) -> np.ndarray:
        """When the timer of each chunk from `oldest` to `next_to_send` started."""
        window = slice(self.oldest, self.next_to_send)
        sent = self.last_sent[window]
        if not self.restarts or not sent.size:
            return sent
        answered = self.answered_at[window]
        ahead = np.maximum.accumulate(np.append(self.answered_before_oldest, answered[:-1]))
        behind = np.maximum.accumulate(np.append(answered[1:], -np.inf)[::-1])[::-1]
        queued = np.maximum(np.maximum(sent, ahead), self.restarted_at[window])
        return np.where(behind > sent, sent, queued)  # skipped: from its last send

    def deadlines(self, timer: RetransmissionTimer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The chunks in flight (indices, oldest first), when each one's timer started and
        when it times out."""
        window = np.arange(self.oldest, self.next_to_send)
        open_ = ~self.done[window]
        start = self.starts()[open_]
        inflight = window[open_]
        return inflight, start, start + timer.timeouts(self.tries[inflight])

    def next_deadline(self, timer: RetransmissionTimer) -> float:
        """When the first timer of the chunks in flight runs out (inf: none in flight)."""
        inflight, _, deadline = self.deadlines(timer)
        return float(deadline.min()) if inflight.size else math.inf

    def deadline_bound(self, timer: RetransmissionTimer) -> float:
        """A lower bound of `next_deadline` at a fraction of its cost: a chunk's timer starts
        at or after its last send, and no chunk's timeout is below a first try's."""
        if self.oldest >= self.next_to_send:  # every chunk sent is answered
            return math.inf
        return float(self.last_sent[self.oldest : self.next_to_send].min()) + timer.timeout(0)

    def probe_if_silent(
        self, expired: np.ndarray, inflight: np.ndarray, start: np.ndarray, now: float
    ) -> np.ndarray:
        """Which of the `expired` positions (in `inflight`) to resend: every one that was
        skipped (a later chunk answered since its timer started), and of those that expired
        in silence only the earliest, restarting the timers of every silent chunk in flight."""
        silent = start >= self.last_answer
        if not silent[expired].any():
            return expired
        self.restarted_at[inflight[silent]] = now
        return np.sort(np.append(expired[~silent[expired]], expired[silent[expired]][0]))

    def passed_over(self, i: int, answers: int) -> np.ndarray:
        """The chunks before chunk i (just answered) that were sent once and have at least
        `answers` chunks sent after them answered: the switch answers a rank's chunks in
        order, so each was lost, or its round waits for a peer whose contribution was lost
        (its resend is then dropped as a duplicate). More than one answer is asked for so
        that a datagram merely overtaken is not resent (TCP's three duplicate ACKs)."""
        window = np.arange(self.oldest, i)
        done = self.done[self.oldest : self.next_to_send]
        later = (np.cumsum(done[::-1])[::-1] - done)[: i - self.oldest]  # answered after each
        picked = ~done[: i - self.oldest] & (self.tries[window] == 0) & (later >= answers)
        return window[picked]

    def lost_before(self, i: int) -> np.ndarray:
        """Chunk i's result answered a resend of it: the chunks still open that were last
        sent before its first resend. The switch handled them before that resend and answers
        in order, so they got no answer: lost (or their rounds wait for a peer; the switch
        then drops their resends as duplicates)."""
        window = np.arange(self.oldest, self.next_to_send)
        lost = ~self.done[window] & (self.last_sent[window] < self.first_resent[i])
        return window[lost]
