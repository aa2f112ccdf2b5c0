"""Buckets agreed through the switch (homagg/worker/ddp/agreement.py): W ranks as threads of
this process, each with its own hook state, over a fake switch that combines every rank's
phase as the real one does and can die after answering a round to some ranks only; the
process group's agreement and all_reduce run over a thread barrier. Every rank takes the
same path for every bucket, also when the switch dies between its copies of a verdict's
answer, a codec fails on one rank, or an agent turns unhealthy; and the vectors' names."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from homagg.control.job_record import GaveUp
from homagg.lab.threads import run_threads
from homagg.wire.constants import Op
from homagg.worker.codecs import CodecError
from homagg.worker.codecs.base import Phase
from homagg.worker.codecs.simulate import combine
from homagg.worker.ddp.agreement import (
    CODEC_FAILED,
    OK,
    SWITCH_TIMEOUT,
    UNHEALTHY,
    GlooVerdict,
    SwitchVerdict,
    resolve,
)
from homagg.worker.ddp.hook import SwitchHookState
from homagg.worker.ddp.switch_path import RawPhases, aggregate_bucket, agreed_sum
from homagg.worker.transport.switch_transport import TransportConfig, TransportError, TransportStats

WORLD = 3
WAIT = 0.5  # s: a rank's wait for a result before it gives up (the transport's budget)
BOUND = 30.0  # s: no test may take longer (threads, barrier)


class FakeSwitch:
    """Rounds by chunk: the combination of every rank's cells, answered to every rank; after
    `dies_at` (a chunk) it answers that round to `answers` only and nothing later."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rounds: dict[int, dict[int, tuple[Op, np.ndarray]]] = {}
        self.results: dict[int, np.ndarray] = {}
        self.gave_up: list[GaveUp] = []
        self.dies_at: int | None = None
        self.answers: set[int] = set()

    def answered(self, rank: int, chunk: int) -> bool:
        if self.dies_at is None or chunk < self.dies_at:
            return chunk in self.results
        return chunk == self.dies_at and rank in self.answers and chunk in self.results

    def exchange(self, rank: int, chunk: int, op: Op, cells: np.ndarray, since: int) -> np.ndarray:
        with self.cond:
            parts = self.rounds.setdefault(chunk, {})
            parts[rank] = (op, cells.copy())
            if len(parts) == WORLD:
                ops = {o for o, _ in parts.values()}
                assert len(ops) == 1, f"chunk {chunk}: ops {ops} differ"
                self.results[chunk] = combine(op, [c for _, c in parts.values()])
                self.cond.notify_all()
            deadline = time.monotonic() + WAIT
            while not self.answered(rank, chunk):
                told = [g for g in self.gave_up if g.rank != rank and g.chunk >= since]
                if told:
                    raise TransportError(f"no result for chunk {chunk}: {told[-1]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    gave_up = GaveUp(rank, chunk, "no result within the budget")
                    self.gave_up.append(gave_up)  # the transport tells when it gives up
                    raise TransportError(f"no result for chunk {chunk}")
                self.cond.wait(min(left, 0.01))
            return self.results[chunk]

    def tell(self, gave_up: GaveUp) -> None:
        with self.cond:
            self.gave_up.append(gave_up)
            self.cond.notify_all()


class FakeTransport:
    """A rank's transport over the fake switch: one chunk per phase."""

    def __init__(self, switch: FakeSwitch, rank: int) -> None:
        self.switch, self.rank = switch, rank
        self.config = TransportConfig(job_id=1, rank=rank, world_size=WORLD, pool_size=1)
        self.stats = TransportStats()
        self._next, self.aligned = 0, 0

    @property
    def next_chunk(self) -> int:
        return self._next

    @next_chunk.setter
    def next_chunk(self, chunk: int) -> None:
        self._next = self.aligned = chunk

    def run(self, gen):
        phase = next(gen)
        while True:
            chunk = self._next
            self._next += 1
            cells = np.asarray(phase.cells, np.int32)
            summed = self.switch.exchange(self.rank, chunk, phase.op, cells, self.aligned)
            try:
                phase = gen.send(summed)
            except StopIteration as done:
                return done.value


@dataclass
class FakeAgent:
    transport: FakeTransport
    healthy: bool = True
    unhealthy_reason: str = ""
    told: list = field(default_factory=list)

    def tell_peers(self, gave_up: GaveUp) -> None:
        self.told.append(gave_up)
        self.transport.switch.tell(gave_up)


class Group:
    """The process group of thread ranks: MAX and SUM all_reduces over a barrier."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(WORLD, timeout=BOUND)
        self.parts: list[torch.Tensor | None] = [None] * WORLD
        self.calls: list[list[str]] = [[] for _ in range(WORLD)]

    def reduce(self, rank: int, t: torch.Tensor, what: str) -> None:
        self.calls[rank].append(what)
        self.parts[rank] = t.clone()
        self.barrier.wait()
        parts = [p for p in self.parts if p is not None]
        assert len({p.shape for p in parts}) == 1, f"{what}: shapes differ: ranks paired wrongly"
        stacked = torch.stack(parts)
        top = stacked.amax(dim=0) if what == "max" else stacked.sum(dim=0)
        self.barrier.wait()
        t.copy_(top)


class ThreadWork:
    """A collective started on a thread of its own, as gloo runs an asynchronous one."""

    def __init__(self, run) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self.thread.start()

    def _run(self, run) -> None:
        try:
            run()
        except BaseException as exc:  # the waiter re-raises it
            self.error = exc

    def wait(self, timeout=None) -> None:
        self.thread.join(BOUND if timeout is None else timeout.total_seconds())
        if self.thread.is_alive():
            raise RuntimeError("the collective did not finish in time")
        if self.error is not None:
            raise RuntimeError(f"the collective failed: {self.error!r}")


class ThreadHook(SwitchHookState):
    """One rank's hook state, its collectives over `Group`."""

    def __init__(self, agent: FakeAgent, rank: int, group: Group) -> None:
        super().__init__(agent, "fixed_point", world_size=WORLD, rank=rank, cooldown_steps=1)
        self.pg = group

    def reduce_max(self, t: torch.Tensor) -> None:
        self.pg.reduce(self.rank, t, "max")

    started = 0  # MAX all_reduces started without waiting (the steps' seals)
    gate: threading.Event | None = None  # set: such an all_reduce waits for it first

    def reduce_max_async(self, t: torch.Tensor) -> ThreadWork:
        self.started += 1

        def run() -> None:
            if self.gate is not None:
                assert self.gate.wait(BOUND)
            self.pg.reduce(self.rank, t, "max")

        return ThreadWork(run)

    def host_all_reduce(self, buf: torch.Tensor) -> None:
        self.pg.reduce(self.rank, buf, "sum")


@pytest.fixture
def ranks():
    switch, group = FakeSwitch(), Group()
    hooks = [ThreadHook(FakeAgent(FakeTransport(switch, r)), r, group) for r in range(WORLD)]
    return switch, group, hooks


def grads(step: int, bucket: int) -> list[torch.Tensor]:
    """Every rank's gradient of a bucket: small integers, so fixed point sums them exactly."""
    rng = np.random.default_rng(100 * step + bucket)
    return [torch.tensor(rng.integers(-50, 50, 64), dtype=torch.float32) for _ in range(WORLD)]


def run_steps(hooks, steps: int, buckets: int, before=None) -> list[list[tuple]]:
    """`steps` steps of `buckets` buckets on every rank (the last one seals the step); per
    rank, per bucket, (path taken, result); `before(rank, step, bucket)` first."""

    def rank(r: int) -> list[tuple]:
        h, seen = hooks[r], []
        for s in range(steps):
            for b in range(buckets):
                if before is not None:
                    before(r, s, b)
                on_switch = h.stats.switch_buckets
                out = aggregate_bucket(h, b, grads(s, b)[r].clone(), last=b == buckets - 1)
                seen.append(("switch" if h.stats.switch_buckets > on_switch else "host", out))
            h.end_step()
        return seen

    return run_threads([lambda r=r: rank(r) for r in range(WORLD)], BOUND)[1]


def assert_same_path_and_exact(seen: list[list[tuple]], buckets: int) -> list[str]:
    """Every rank took the same path for every bucket and has the exact mean; the paths."""
    paths = [p for p, _ in seen[0]]
    for r in range(1, WORLD):
        assert [p for p, _ in seen[r]] == paths, f"rank {r}'s paths differ"
    for i in range(len(paths)):
        s, b = divmod(i, buckets)
        want = torch.stack(grads(s, b)).sum(dim=0) / WORLD
        for r in range(WORLD):
            torch.testing.assert_close(seen[r][i][1], want, msg=f"bucket {i} on rank {r}")
    return paths


def test_buckets_in_a_step_are_agreed_by_the_switch_and_the_step_sealed_once(ranks):
    _, group, hooks = ranks
    seen = run_steps(hooks, steps=2, buckets=3)
    assert assert_same_path_and_exact(seen, 3) == ["switch"] * 6
    for h in hooks:  # every bucket by a verdict packet; the health check and the first
        # step's seal read (by the second step's first bucket), the second one in flight
        assert h.stats.switch_agreements == 6 and h.stats.agreements == 2
        assert h.fallback.unsealed == 0 and h.fallback.pending is not None
        assert h.stats.fallbacks == 0
    assert group.calls[0] == ["max"] * 3 and all(h.started == 2 for h in hooks)
    run_threads([h.close for h in hooks], BOUND)  # close() reads the last one
    assert all(h.stats.agreements == 3 and h.fallback.pending is None for h in hooks)


def test_the_steps_last_bucket_does_not_wait_on_the_process_group(ranks):
    _, _, hooks = ranks
    gate = threading.Event()  # the steps' seals wait until it is set
    for h in hooks:
        h.gate = gate
    run_threads([h.use_switch for h in hooks], BOUND)  # the health check: no seal
    seen = run_steps(hooks, steps=1, buckets=2)  # the seal is started, and still waiting
    assert assert_same_path_and_exact(seen, 2) == ["switch"] * 2
    assert all(h.fallback.pending is not None for h in hooks)
    gate.set()
    run_threads([h.close for h in hooks], BOUND)
    assert all(h.fallback.pending is None and h.fallback.use for h in hooks)


def test_a_switch_that_dies_between_its_copies_of_the_last_verdict_ends_in_one_path(ranks):
    switch, group, hooks = ranks
    run_steps(hooks, steps=1, buckets=3)  # chunks 0-9: health check, 3 x (MAX, ADD, verdict)
    last_verdict = hooks[0].agent.transport.next_chunk + 8  # bucket 2's, the next step's
    switch.dies_at, switch.answers = last_verdict, {0, 2}
    start = time.monotonic()
    seen = run_steps(hooks, steps=3, buckets=3)
    # the step is kept everywhere (ranks 0 and 2 decided it, rank 1 learnt from their seal
    # that every rank had sent it); then every rank falls back together
    paths = assert_same_path_and_exact(seen, 3)
    assert paths[:3] == ["switch"] * 3, paths
    assert all(p == "host" for p in paths[3:]), paths
    assert [h.stats.fallbacks for h in hooks] == [hooks[0].stats.fallbacks] * WORLD
    run_threads([h.close for h in hooks], BOUND)
    assert [len(c) for c in group.calls] == [len(group.calls[0])] * WORLD
    assert time.monotonic() - start < 10 * WAIT


def test_a_switch_that_dies_between_its_copies_of_a_verdict_still_ends_in_one_path(ranks):
    switch, group, hooks = ranks
    run_steps(hooks, steps=1, buckets=3)  # chunks 0-8: health check, 3 x (MAX, ADD), 2 verdicts
    verdict = hooks[0].agent.transport.next_chunk + 2  # bucket 0's verdict in the next step
    switch.dies_at, switch.answers = verdict, {0}
    start = time.monotonic()
    seen = run_steps(hooks, steps=3, buckets=3)
    # bucket 0 kept everywhere (rank 0 decided it, the others learnt every rank had sent
    # it); bucket 1 redone on the host by every rank; the cool-down (1 step); the health
    # check (the switch is still dead: its next bucket fails and falls back again)
    paths = assert_same_path_and_exact(seen, 3)
    assert paths[:3] == ["switch", "host", "host"], paths
    assert all(p == "host" for p in paths[3:]), paths
    assert [h.stats.fallbacks for h in hooks] == [hooks[0].stats.fallbacks] * WORLD
    assert not any(h.fallback.use for h in hooks)
    assert [len(c) for c in group.calls] == [len(group.calls[0])] * WORLD
    assert time.monotonic() - start < 10 * WAIT


def test_a_codec_that_fails_on_one_rank_is_told_and_every_rank_falls_back(ranks):
    _, _, hooks = ranks
    cells = np.arange(8, dtype=np.int32)

    def phases(r: int):
        summed = yield Phase(Op.ADD, cells)
        if r == 1:
            raise CodecError("a fingerprint that only rank 1 sees")
        return summed

    def rank(r: int):
        hooks[r].use_switch()
        start = time.monotonic()
        out = agreed_sum(hooks[r], 0, RawPhases(phases(r)), cells.size, last=False)
        return out, time.monotonic() - start

    outcome = run_threads([lambda r=r: rank(r) for r in range(WORLD)], BOUND)[1]
    assert all(out is None for out, _ in outcome), outcome  # redone on the host by all
    assert max(t for _, t in outcome) < WAIT  # told at once: nobody waited out its budget
    assert hooks[1].agent.told and not hooks[0].agent.told
    assert len({tuple(h.stats.fallback_reasons.items()) for h in hooks}) == 1


def test_an_agent_unhealthy_before_a_bucket_is_told_and_every_rank_falls_back(ranks):
    _, _, hooks = ranks

    def sicken(r: int, s: int, b: int) -> None:
        if r == 2 and (s, b) == (0, 1):  # its heartbeat failed after bucket 0
            hooks[r].agent.healthy = False

    start = time.monotonic()
    seen = run_steps(hooks, steps=1, buckets=3, before=sicken)
    paths = assert_same_path_and_exact(seen, 3)
    assert paths == ["switch", "host", "host"], paths
    assert time.monotonic() - start < WAIT  # told: nobody waited out its budget
    assert len({tuple(h.stats.fallback_reasons.items()) for h in hooks}) == 1


def test_the_verdict_reports_health_after_the_phases(ranks):
    _, _, hooks = ranks
    cells = np.arange(4, dtype=np.int32)

    def phases(r: int):
        summed = yield Phase(Op.ADD, cells)
        if r == 0:
            hooks[r].agent.healthy = False  # the heartbeat failed while the bucket ran
        return summed

    def rank(r: int):
        hooks[r].use_switch()
        return agreed_sum(hooks[r], 0, RawPhases(phases(r)), cells.size, last=False)

    outcome = run_threads([lambda r=r: rank(r) for r in range(WORLD)], BOUND)[1]
    for out in outcome:  # the result is kept; the switch said: fall back from the next bucket
        np.testing.assert_array_equal(out, WORLD * cells)
    assert all(h.fallback.use is False and h.stats.switch_agreements == 1 for h in hooks)
    assert all(h.stats.agreements == 2 for h in hooks)  # the health check and the seal


# -- the vectors and their reading ------------------------------------------------------


def agreed(*ranks: GlooVerdict) -> GlooVerdict:
    return GlooVerdict.from_agreed(torch.stack([r.pack() for r in ranks]).amax(dim=0))


def test_gloo_verdict_fields_round_trip_by_name():
    v = GlooVerdict.local(done=7, failure=CODEC_FAILED, stream=OK, health=OK, chunk=2**40, step=3)
    assert GlooVerdict.from_agreed(v.pack()) == v and v.neg_done == -7
    assert SwitchVerdict.from_cells(SwitchVerdict(UNHEALTHY).cells()) == SwitchVerdict(UNHEALTHY)
    with pytest.raises(ValueError, match="2 cells"):
        SwitchVerdict.from_cells(np.zeros(2, np.int32))


def test_resolve_all_level_all_ok_stays_on_the_switch():
    mine = GlooVerdict.local(4, OK, OK, OK, 10, 2)
    r = resolve(agreed(mine, mine), 4)
    assert (r.keep, r.kind, r.chunk, r.step, r.done) == (True, OK, 10, 2, 5)


def test_resolve_a_rank_behind_keeps_and_everyone_falls_back():
    behind = GlooVerdict.local(4, OK, SWITCH_TIMEOUT, OK, 12, 2)  # its verdict unanswered
    ahead = GlooVerdict.local(5, SWITCH_TIMEOUT, OK, OK, 15, 3)  # its next bucket failed
    both = agreed(behind, ahead)
    r_behind, r_ahead = resolve(both, 4), resolve(both, 5)
    assert r_behind.keep and not r_ahead.keep
    assert r_behind.kind == r_ahead.kind == SWITCH_TIMEOUT
    assert r_behind.done == r_ahead.done == 6 and r_behind.step == 3 and r_behind.chunk == 15


def test_resolve_a_seal_ahead_of_a_rank_behind_still_falls_back():
    behind = GlooVerdict.local(4, OK, SWITCH_TIMEOUT, OK, 12, 2)
    seal = GlooVerdict.local(5, OK, OK, OK, 12, 2)
    r = resolve(agreed(behind, seal), 4)
    assert r.keep and r.kind == SWITCH_TIMEOUT


def test_resolve_a_failure_anywhere_fails_the_bucket_everywhere():
    ok = GlooVerdict.local(4, OK, OK, OK, 12, 2)
    failed = GlooVerdict.local(4, CODEC_FAILED, OK, OK, 11, 2)
    r = resolve(agreed(ok, failed, ok), 4)
    assert not r.keep and r.kind == CODEC_FAILED
    every_verdict_lost = GlooVerdict.local(4, OK, SWITCH_TIMEOUT, OK, 12, 2)
    r = resolve(agreed(every_verdict_lost, every_verdict_lost), 4)
    assert r.keep and r.kind == SWITCH_TIMEOUT  # all phases succeeded: kept, then fall back
