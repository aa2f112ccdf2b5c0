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
import torch

from worker.auto_control import HOST, AutoConfig, AutoController, Choice, Taken
from worker.ddp_hook import SwitchHookState


class Pipeline:
    """Drives controllers (one per rank) as the hook does: each step's vectors are agreed
    (MAX over ranks) and decide `lag` steps later."""

    def __init__(self, ctls: Sequence[AutoController]) -> None:
        self.ctls = list(ctls)
        self.waiting: deque[tuple[list[int], np.ndarray, list[Taken]]] = deque()

    def end_step(self, budgets: dict[int, float], before: float) -> None:
        """This step's numbers, recorded on every controller, into the pipeline."""
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
) -> list[str]:
    """Bucket 0 for `steps` steps; cost(choice, step, rank) seconds: the labels that ran."""
    pipe, labels, before = Pipeline(ctls), [], 0.0
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
    assert log == ["start 0", "start 1", "wait 0"]
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
