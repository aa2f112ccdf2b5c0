"""codec="auto"'s decision through the switch (homagg/worker/ddp/auto_agreement.py): W ranks
as threads of this process over the fake switch of test_switch_agreements, each rank's
controller fed the same simulated measurements as the process group's way. The decisions
are the same both ways, also when one rank's answer is dropped or the switch dies while it
answers: the rank that missed it meets the others in the process group, every rank repairs
the vector there, and every rank falls back together."""

from __future__ import annotations

import numpy as np
import torch

from homagg.lab.threads import run_threads
from homagg.wire.constants import Op
from homagg.worker.auto.control import HOST, AutoConfig, Choice
from homagg.worker.auto.measurements import Measurements, from_cells, to_cells
from homagg.worker.ddp.hook import SwitchHookState
from homagg.worker.ddp.switch_path import aggregate_bucket
from tests.worker.test_auto_pipeline import wire
from tests.worker.test_switch_agreements import (
    BOUND,
    WAIT,
    WORLD,
    FakeAgent,
    FakeSwitch,
    FakeTransport,
    Group,
    grads,
)

BUCKETS = 3
DECISION = 4 * BUCKETS + 1  # cells of a decision: cost, budget, share, wire; the iteration


class DoneWork:
    """An all_reduce already done (the thread group reduces at once, in call order)."""

    def wait(self, timeout: object = None) -> bool:
        return True


class AutoThreadHook(SwitchHookState):
    """One rank's codec="auto" hook state, its collectives over `Group`."""

    def __init__(self, agent: FakeAgent, rank: int, group: Group, through_switch: bool) -> None:
        super().__init__(
            agent,
            "auto",
            world_size=WORLD,
            rank=rank,
            cooldown_steps=1,
            auto=AutoConfig(lease=1),
            switch_decisions=through_switch,
        )
        self.pg = group

    def reduce_max(self, t: torch.Tensor) -> None:
        self.pg.reduce(self.rank, t, "max")

    def reduce_max_async(self, t: torch.Tensor) -> DoneWork:  # type: ignore[override]
        self.pg.reduce(self.rank, t, "max")
        return DoneWork()

    def host_all_reduce(self, buf: torch.Tensor) -> None:
        self.pg.reduce(self.rank, buf, "sum")


class DecisionSwitch(FakeSwitch):
    """The fake switch; at the `fail_at`-th decision packet (a MAX of DECISION cells) it
    answers `answers` only: with `dies`, nothing after it either."""

    def __init__(self, fail_at: int | None = None, answers=(), dies: bool = False) -> None:
        super().__init__()
        self.fail_at, self.fail_answers, self.dies = fail_at, set(answers), dies
        self.decisions: list[int] = []  # their chunks
        self.dropped: tuple[int, set[int]] | None = None

    def exchange(self, rank, chunk, op, cells, since):
        with self.cond:
            if op == Op.MAX and cells.size == DECISION and chunk not in self.decisions:
                self.decisions.append(chunk)
                if len(self.decisions) == self.fail_at:
                    if self.dies:
                        self.dies_at, self.answers = chunk, self.fail_answers
                    else:
                        self.dropped = (chunk, self.fail_answers)
        return super().exchange(rank, chunk, op, cells, since)

    def answered(self, rank: int, chunk: int) -> bool:
        if self.dropped is not None and chunk == self.dropped[0]:
            return rank in self.dropped[1] and chunk in self.results
        return super().answered(rank, chunk)


def cost(rank: int, step: int, bucket: int, choice: Choice) -> float:
    """A bucket's seconds on one rank: the switch a quarter of the host path's, every rank
    a little different (MIN over ranks), none on the microsecond."""
    base = 0.0201234567 if choice.method == HOST else 0.0051234567 * (1 + choice.density)
    return base * (1 + 0.1 * rank) * (1 + 0.03 * ((step * 7 + bucket * 3) % 5))


def run_auto(switch: FakeSwitch, through_switch: bool, steps: int):
    """`steps` steps on every rank: each bucket on the path auto chose (the switch's with
    its verdict, the last one's sealing the step), its cost then measured as `cost` says,
    the step's end; every rank's hook state, the group and the wall time."""
    group = Group()
    hooks = [
        AutoThreadHook(FakeAgent(FakeTransport(switch, r)), r, group, through_switch)
        for r in range(WORLD)
    ]

    def rank(r: int) -> None:
        h = hooks[r]
        ctl = h.controller
        assert ctl is not None
        for s in range(steps):
            for b in range(BUCKETS):
                ran = ctl.choice(b)
                aggregate_bucket(h, b, grads(s, b)[r].clone(), last=b == BUCKETS - 1)
                ctl.record(b, cost(r, s, b, ran), ran, 0.9 - 0.1 * r, wire(ran))
            h.iteration_seconds = 0.05 + 0.001 * r + 0.0001 * s
            h.end_step({b: 0.004 * (b + 1) * (1 + 0.05 * r) for b in range(BUCKETS)})

    seconds, _ = run_threads([lambda r=r: rank(r) for r in range(WORLD)], BOUND)
    return hooks, group, seconds


def assert_alike(hooks, reference) -> None:
    """Every rank decided what the reference's ranks did, and made the same collectives."""
    want = reference[0].controller.history
    assert any(c != HOST for step in want for c in step.values()), want  # the switch ran
    for h in hooks:
        assert h.controller.history == want, f"rank {h.rank}"
    calls = [len(c) for c in hooks[0].pg.calls]
    assert calls == [calls[0]] * WORLD, calls


def test_cells_carry_the_vector_in_millionths_clamped_to_int32():
    m = Measurements(
        costs=np.array([0.0123456789, 5000.0]),
        budgets=np.array([0.001, 0.0]),
        nonzero=np.array([0.25, 1.0]),
        wires=np.array([0.0625, np.nan]),
        iteration=0.07,
    )
    cells = to_cells(m.pack())
    assert cells.dtype == np.int32
    assert cells[0] == -12346 and cells[1] == -(2**31 - 1) and cells[7] == 0
    back = Measurements.from_agreed(from_cells(cells), 2)
    assert back.costs[0] == 0.012346 and back.nonzero[0] == 0.25 and back.iteration == 0.07


def test_the_decision_through_the_switch_is_the_process_groups():
    steps = 8
    by_gloo, _, _ = run_auto(FakeSwitch(), False, steps)
    by_switch, _, _ = run_auto(FakeSwitch(), True, steps)
    assert_alike(by_switch, by_gloo)
    for gloo, switch in zip(by_gloo, by_switch, strict=True):
        assert gloo.stats.switch_decisions == 0 and switch.stats.switch_decisions >= 4
        # each decision through the switch spares one all_reduce, its seal being the next
        # step's own, but where that step's last bucket, and so its seal, takes the host
        # path after the switch's (one here: its end seals)
        spared = gloo.stats.agreements - switch.stats.agreements
        assert switch.stats.switch_decisions - 1 <= spared <= switch.stats.switch_decisions
        assert switch.stats.fallbacks == 0 and switch.stats.decision_repairs == 0


def test_a_dropped_answer_on_one_rank_is_repaired_and_every_rank_falls_back():
    steps = 12
    by_gloo, _, reference = run_auto(FakeSwitch(), False, steps)
    switch = DecisionSwitch(fail_at=2, answers={0, 1})  # rank 2 never gets it
    hooks, _, seconds = run_auto(switch, True, steps)
    assert_alike(hooks, by_gloo)
    assert [h.stats.decision_repairs for h in hooks] == [1] * WORLD
    assert [h.stats.fallbacks for h in hooks] == [1] * WORLD
    assert all(h.stats.switch_decisions >= 3 for h in hooks)  # back on the switch after
    assert seconds < reference + 3 * WAIT  # one budget waited out (rank 2's), not more


def test_a_switch_that_dies_mid_decision_ends_in_one_agreed_fallback():
    steps = 6
    by_gloo, _, reference = run_auto(FakeSwitch(), False, steps)
    switch = DecisionSwitch(fail_at=1, answers={0}, dies=True)  # rank 0 alone got it
    hooks, _, seconds = run_auto(switch, True, steps)
    assert_alike(hooks, by_gloo)
    repairs = hooks[0].stats.decision_repairs
    assert repairs >= 1 and [h.stats.decision_repairs for h in hooks] == [repairs] * WORLD
    assert all(h.stats.fallbacks == hooks[0].stats.fallbacks >= 1 for h in hooks)
    assert not any(h.fallback.use for h in hooks)
    # each failure waits out one rank's budget (the others are told), and only that
    assert seconds < reference + 2 * (repairs + hooks[0].stats.fallbacks) * WAIT


def test_the_next_step_starts_before_the_decision_is_sent_and_is_not_overtaken():
    state = SwitchHookState(None, codec="auto", world_size=2, rank=0, auto=AutoConfig(lag=1))
    host = state.auto_host
    assert host is not None and state.controller is not None
    seen: list[bool] = []

    def send(t: torch.Tensor) -> DoneWork:
        seen.append(host.decided.is_set())  # the next step's choices may be read now
        host.deciding()  # ... and that step's last bucket is handed over meanwhile
        return DoneWork()

    state.reduce_max_async = send  # type: ignore[method-assign]
    for _ in range(3):
        ran = state.controller.choice(0)
        state.controller.record(0, 0.01, ran, 1.0, wire(ran))
        host.deciding()  # this step's last bucket handed over
        state.end_step({0: 0.1})
        assert not host.decided.is_set()  # the next step's end has not decided yet
    assert seen == [True] * 3
