"""codec="auto" pipelined (AutoConfig.lag = 1, the default): a step's numbers are agreed
while the next step runs and decide the step after it, so no bucket waits for the
network. The rule acts on the density it measured (an overrun seen twice at one density
compresses once), ranks with different local numbers still decide alike, numbers from
before a `release` teach nothing, and the hook waits for an agreement only a step after
starting it (and for the last one at close)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from homagg.worker.auto.control import HOST, AutoConfig, AutoController, Choice
from homagg.worker.auto.measurements import Taken
from homagg.worker.ddp.hook import SwitchHookState


class Pipeline:
    """Drives controllers (one per rank) as the hook does: each step's vectors are agreed
    (MAX over ranks) and decide `lag` steps later."""

    def __init__(self, ctls: Sequence[AutoController]) -> None:
        self.ctls = list(ctls)
        self.waiting: deque[tuple[list[int], np.ndarray, list[Taken]]] = deque()
        self.skipped = 0  # steps whose agreement a lease skipped

    def end_step(self, budgets: dict[int, float], before: float) -> None:
        """This step's numbers, recorded on every controller, into the pipeline (none while
        the controllers hold a lease: they skip the step)."""
        if self.ctls[0].lease > 0:
            assert all(c.lease > 0 for c in self.ctls)  # every rank skips alike
            for c in self.ctls:
                c.skip()
            self.skipped += 1
            return
        indices = sorted(budgets)
        vectors = [c.measurements(indices, budgets, before) for c in self.ctls]
        taken = [c.taken() for c in self.ctls]
        self.waiting.append((indices, np.max(vectors, axis=0), taken))
        if len(self.waiting) > self.ctls[0].config.lag:
            indices, agreed, taken = self.waiting.popleft()
            for ctl, tk in zip(self.ctls, taken):
                ctl.decide(indices, agreed, tk)


def wire(choice: Choice) -> float:
    return 0.0 if choice.method == HOST else choice.density


def run(
    ctls: Sequence[AutoController],
    cost: Callable[[Choice, int, int], float],
    budget: float,
    steps: int,
    pipe: Pipeline | None = None,
) -> list[str]:
    """Bucket 0 for `steps` steps; cost(choice, step, rank) seconds: the labels that ran."""
    pipe, labels, before = pipe or Pipeline(ctls), [], 0.0
    for t in range(steps):
        ran = [c.choice(0) for c in ctls]
        assert len({r.label for r in ran}) == 1, ran  # every rank runs the same path
        secs = [cost(r, t, rank) for rank, r in enumerate(ran)]
        for ctl, r, s in zip(ctls, ran, secs):
            ctl.record(0, s, r, 1.0, wire(r))
        pipe.end_step({0: budget}, before)
        before = max(secs) + 0.01
        labels.append(ran[0].label)
    return labels


def slow_host(ctl: AutoController) -> AutoController:
    """The host path far dearer than any switch arm, so the rule on the switch decides."""
    ctl.ledger.refresh = 10**9
    ctl.ledger.times["host"] = deque([(0, 100.0)])
    ctl.ledger.rests["host"] = deque([(0, 100.0)])
    return ctl


def overrun_until_dense(choice: Choice, step: int, rank: int) -> float:
    """The switch hides a bucket (budget 1) only at density 1/8 or below; the host: 50."""
    return 50.0 if choice.method == HOST else 0.4 + 4.0 * choice.density


def test_an_overrun_seen_twice_at_one_density_compresses_once():
    densities = {}
    for lag in (0, 1):
        ctl = slow_host(AutoController(AutoConfig(lag=lag)))
        labels = run([ctl], overrun_until_dense, 1.0, 14)
        densities[lag] = labels
    # lag 0: host, the exact codec, then halving every step down to 1/8; lag 1: one more
    # host step (nothing decided yet) and each density twice (its second overrun was
    # measured before the first one's decision ran), down to the same 1/8: no overshoot
    halving = ["cltk@0.5", "cltk@0.25", "cltk@0.125"]
    assert densities[0][:6] == [HOST, "fixed_point", *halving, "cltk@0.125"]
    twice = [label for label in halving for _ in (0, 1)]
    assert densities[1][:10] == [HOST, HOST, "fixed_point", "fixed_point", *twice]
    assert set(densities[1][10:]) == {"cltk@0.125"}


def test_ranks_with_different_local_numbers_decide_alike():
    def cost(choice: Choice, step: int, rank: int) -> float:
        base = 0.3 if choice.method == HOST else 0.2 + 2.0 * choice.density
        return base * (1.0 + 0.5 * rank) * (3.0 if 10 <= step < 25 else 1.0)

    ctls = [AutoController(AutoConfig()) for _ in range(3)]
    run(ctls, cost, 0.5, 40)  # asserts the same path on every rank, every step
    assert ctls[0].history == ctls[1].history == ctls[2].history
    assert len(ctls[0].history) == 40 - 1  # the last step's numbers decide nothing yet


def test_numbers_taken_before_a_release_teach_nothing():
    ctl = AutoController(AutoConfig())
    ctl.hold()
    ran = ctl.choice(0)
    ctl.record(0, 9.0, ran, 0.9, 1.0)
    vector, taken = ctl.measurements([0], {0: 0.01}, 0.0), ctl.taken()
    ctl.release()
    ctl.decide([0], vector, taken)
    assert ctl.buckets[0].costs.costs == {}  # nothing learned from the held step
    assert ctl.ledger.credit == 0.0


class RecordedWork:
    """A finished all_reduce that notes when it is waited for."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait(self, timeout: object = None) -> bool:
        self.log.append(f"wait {self.name}")
        return True


class GonePeerWork:
    """An all_reduce whose peer is gone: its wait times out."""

    def __init__(self) -> None:
        self.timeouts: list[object] = []

    def wait(self, timeout: object = None) -> bool:
        self.timeouts.append(timeout)
        raise RuntimeError("Timed out waiting for the peer")


def hook_state(lag: int, log: list[str]) -> SwitchHookState:
    state = SwitchHookState(None, codec="auto", world_size=2, rank=0, auto=AutoConfig(lag=lag))
    started = iter(range(100))

    def start(t: torch.Tensor) -> RecordedWork:
        name = str(next(started))
        log.append(f"start {name}")
        return RecordedWork(log, name)

    state.reduce_max_async = start  # type: ignore[method-assign]
    return state


def one_step(state: SwitchHookState) -> dict[int, str]:
    assert state.controller is not None
    ran = state.controller.choice(0)
    state.controller.record(0, 0.01, ran, 1.0, wire(ran))
    return state.auto_decide({0: 0.1})


def test_the_hook_waits_for_an_agreement_a_step_after_starting_it():
    log: list[str] = []
    state = hook_state(1, log)
    assert one_step(state) == {}  # step 0's numbers are on the wire: nothing to decide yet
    assert log == ["start 0"]
    assert one_step(state) == {0: state.controller.choice(0).label}  # type: ignore[union-attr]
    assert log == ["start 0", "wait 0", "start 1"]  # step 0 decides, then step 1 goes
    state.close()  # the one in flight is finished, not left behind
    assert log[-1] == "wait 1" and state._agreeing == deque()
    assert state.stats.agreements == 1


def test_lag_0_waits_for_the_agreement_before_the_next_step():
    log: list[str] = []
    state = hook_state(0, log)
    assert one_step(state) != {}
    assert log == ["start 0", "wait 0"]


def test_close_gives_up_on_an_agreement_whose_peer_is_gone():
    state = hook_state(1, [])
    gone = GonePeerWork()
    state.reduce_max_async = lambda t: gone  # type: ignore[method-assign]
    one_step(state)
    state.close()  # no hang, no exception: the step's numbers decide nothing any more
    assert len(gone.timeouts) == 1 and gone.timeouts[0] is not None
    assert state._agreeing == deque()


def switch_dearer_until(turn: int) -> Callable[[Choice, int, int], float]:
    """The switch path 3x the host path's cost before step `turn`, a fifth of it after."""

    def cost(choice: Choice, step: int, rank: int) -> float:
        if choice.method == HOST:
            return 0.03
        return 0.09 if step < turn else 0.006

    return cost


def test_settled_on_the_host_path_the_ranks_skip_agreements_for_growing_leases():
    ctls = [AutoController(AutoConfig()) for _ in range(3)]
    pipe = Pipeline(ctls)
    labels = run(ctls, switch_dearer_until(10**9), 0.001, 80, pipe)
    assert ctls[0].history == ctls[1].history == ctls[2].history
    assert len(ctls[0].history) == 80 - 1  # a skipped step still has its choices
    assert labels[2] != HOST and labels.count(HOST) >= 70  # measured once, then the host
    # two agreements per lease once settled (the lease doubles 2, 4, 8; the decision from
    # the numbers in flight when it began grants none; an exploration paid by the credit,
    # every 20 to 30 steps here, starts it over): 46 of 80 skipped
    assert pipe.skipped >= 0.5 * 80, pipe.skipped
    never = [AutoController(AutoConfig(lease=1))]
    pipe = Pipeline(never)
    assert run(never, switch_dearer_until(10**9), 0.001, 80, pipe).count(HOST) >= 70
    assert pipe.skipped == 0


def test_a_lease_delays_the_return_to_a_cheaper_switch_by_at_most_its_length():
    waits: dict[int, list[int]] = {1: [], 8: []}
    for lease, turn in ((lease, turn) for lease in waits for turn in (20, 30, 40, 55, 70, 90)):
        ctl = AutoController(AutoConfig(lease=lease))
        labels = run([ctl], switch_dearer_until(turn), 0.001, 200)
        back = next(t for t in range(turn, 200) if labels[t] != HOST)
        assert set(labels[back + 10 :]) != {HOST}  # the switch runs on
        waits[lease].append(back - turn)
    # the return waits for an exploration the credit pays for (the phase of that schedule
    # differs with and without leases: 3 to 43 steps either way), then for the lease's
    # end: on average no more than the lease's length later (measured: 19.7 and 21.7)
    assert max(waits[8]) <= 50 and np.mean(waits[8]) <= np.mean(waits[1]) + 8, waits


def test_no_lease_while_held_or_before_the_switch_is_measured():
    ctl = AutoController(AutoConfig(lag=0))
    ran = ctl.choice(0)
    ctl.record(0, 0.01, ran, 1.0, wire(ran))
    ctl.decide([0], ctl.measurements([0], {0: 0.1}))
    assert ctl.choice(0).method != HOST and ctl.lease == 0  # the switch is measured next
    with pytest.raises(RuntimeError, match="outside a lease"):
        ctl.skip()
    held = AutoController(AutoConfig())
    held.hold()
    run([held], switch_dearer_until(10**9), 0.001, 20)
    assert held.lease == 0 and held.lease_len == 1


def test_no_lease_for_the_host_steps_that_measure_a_slower_host_plan():
    def cost(choice: Choice, step: int, rank: int) -> float:  # NCF with dense tables
        return 0.5 if choice.method == HOST else 0.1

    got = {}
    for lease in (1, 8):
        ctl = AutoController(AutoConfig(lease=lease))
        pipe = Pipeline([ctl])
        got[lease] = run([ctl], cost, 0.001, 60, pipe)
        assert pipe.skipped == 0
    # the first two steps, then the host plan measured twice (lag 1) now and then
    assert got[8] == got[1] and got[8].count(HOST) <= 8, got[8]


def test_the_hook_starts_no_agreement_in_a_leased_step():
    log: list[str] = []
    state = hook_state(1, log)
    ctl = state.controller
    assert ctl is not None
    for _ in range(40):
        ran = ctl.choice(0)
        ctl.record(0, 0.03 if ran.method == HOST else 0.09, ran, 1.0, wire(ran))
        state.end_step({0: 0.001})
        state.iteration_seconds = 0.04 if ran.method == HOST else 0.1  # the step before's
    starts = sum(1 for x in log if x.startswith("start"))
    assert state.stats.leased_steps >= 15 and starts + state.stats.leased_steps == 40
    assert len(ctl.history) == 40 - 1
    state.close()
    assert state._agreeing == deque()
