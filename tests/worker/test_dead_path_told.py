"""A rank that gives up a step tells the others at once, through the controller's heartbeat
answers (homagg/worker/transport/straggler_wait.py), so that every rank reaches the DDP hook's
agreement and
falls back within seconds of the failure instead of after `max_straggler_wait`: a rank whose
link goes down (ENETUNREACH at its next send), a rank that stops receiving results (its MAC
changed: silence for `dead_path_s`). A rank that merely pauses is still waited for.

Four ranks on the reference switch, as threads of this process: each has its own agent (UDP
socket in its host's namespace, heartbeats to an in-process controller) and hook state, whose
agreement runs over a thread barrier instead of a process group. The bounds come from the
configuration (TIMING, the controller's heartbeat interval), not from measurements; SLACK is
what a loaded machine adds to a timer check and an RPC."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator

import numpy as np
import pytest
import torch
from test_agent import open_all

from homagg.lab.controlled import Controlled
from homagg.lab.namespace import have_privileges, ip
from homagg.lab.threads import run_threads
from homagg.wire.constants import CELLS_PER_PKT, Op
from homagg.worker.codecs.base import Phase
from homagg.worker.ddp.hook import SwitchHookState
from homagg.worker.ddp.switch_path import RawPhases, agreed_sum

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="needs root and iproute2 (network namespaces)"
)
WORLD, POOL = 4, 8
# More chunks than the pool: no rank completes the step without every other's contributions.
CELLS = np.arange(3 * POOL * CELLS_PER_PKT, dtype=np.int32)
TIMING = dict(max_retries=4, max_timeout=0.2, dead_path_s=1.0, max_straggler_wait=30.0)
OTHER_MAC = "02:00:00:00:0f:0f"  # rank 0's new MAC: its results go to the registered one
SLACK = 1.0  # s: timer checks and RPCs late on a loaded machine (2 cores, a build beside)
PAUSE = 4.0  # s: longer than any fallback bound below, far shorter than max_straggler_wait


class Agreement:
    """MAX over the ranks' tensors, in place: the hook's process group for threads."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=TIMING["max_straggler_wait"] + 30)
        self.parts: list[torch.Tensor | None] = [None] * world

    def reduce_max(self, rank: int, t: torch.Tensor) -> None:
        self.parts[rank] = t.clone()
        self.barrier.wait()
        top = torch.stack([p for p in self.parts if p is not None]).amax(dim=0)
        self.barrier.wait()  # every rank has read the parts before the next agreement
        t.copy_(top)


class ThreadHook(SwitchHookState):
    """The hook's state of one rank, agreeing over `Agreement`."""

    def __init__(self, agent, rank: int, agreement: Agreement) -> None:
        super().__init__(agent, "lossless", world_size=WORLD, rank=rank, cooldown_steps=1)
        self.agreement = agreement

    def reduce_max(self, t: torch.Tensor) -> None:
        self.agreement.reduce_max(self.rank, t)


def one_add(cells: np.ndarray) -> Generator[Phase, np.ndarray, np.ndarray]:
    summed = yield Phase(Op.ADD, cells)
    return summed


def step(hooks: list[ThreadHook], before: Callable[[int], None]) -> list[tuple[object, float]]:
    """One bucket on every rank at once (`before(rank)` first); per rank the agreed sum (None:
    the agreed fallback) and when its agreement ended, in seconds from the step's start."""
    start = time.monotonic()

    def rank(r: int) -> tuple[object, float]:
        before(r)
        out = agreed_sum(hooks[r], 0, RawPhases(one_add(CELLS)), CELLS.size)
        return out, time.monotonic() - start

    return run_threads([lambda r=r: rank(r) for r in range(WORLD)], 90)[1]


@pytest.fixture
def ranks(tmp_path):
    """Four agents in a job (the first step done through the switch) and their hook states."""
    c = Controlled(tmp_path, WORLD, fabric=True)
    agents: list = []
    try:
        job = c.create(WORLD, pool_size=POOL)
        agents = open_all(c, job, WORLD, **TIMING)
        agreement = Agreement(WORLD)
        hooks = [ThreadHook(a, r, agreement) for r, a in enumerate(agents)]
        for out, _ in step(hooks, lambda r: None):
            np.testing.assert_array_equal(out, WORLD * CELLS)
        yield c, hooks
    finally:
        for a in agents:
            a.close()
        c.close()


def fell_back_together(outcome: list[tuple[object, float]], bound: float, what: str) -> float:
    """Every rank agreed to fall back, the last within `bound` s; that time."""
    assert all(out is None for out, _ in outcome), outcome
    last = max(t for _, t in outcome)
    print(f"{what}: every rank fell back within {last:.2f} s (bound {bound:.2f} s)")
    assert last <= bound
    return last


def heartbeat_s(c: Controlled) -> float:
    return c.server.config.heartbeat_interval if c.server is not None else 0.0


def test_a_link_down_is_told_to_every_rank(ranks):
    c, hooks = ranks
    host = c.fabric.hosts[0]

    def before(r: int) -> None:
        if r == 0:
            ip("link", "set", "dev", host.iface, "down", netns=host.namespace)

    try:
        outcome = step(hooks, before)
    finally:
        ip("link", "set", "dev", host.iface, "up", netns=host.namespace)
    # rank 0 knows at its first send; the others at their next heartbeat and timer check
    bound = heartbeat_s(c) + TIMING["max_timeout"] + SLACK
    fell_back_together(outcome, bound, "link down")


def test_lost_results_are_told_to_every_rank(ranks):
    c, hooks = ranks
    host = c.fabric.hosts[0]

    def before(r: int) -> None:
        if r == 0:  # the switch keeps sending rank 0's results to its registered MAC
            ip("link", "set", "dev", host.iface, "address", OTHER_MAC, netns=host.namespace)

    try:
        outcome = step(hooks, before)
    finally:
        ip("link", "set", "dev", host.iface, "address", host.mac, netns=host.namespace)
    # rank 0: its retry budget (each try at most max_timeout), then dead_path_s of probing
    # in silence; the others: their next heartbeat and timer check
    budget = (TIMING["max_retries"] + 1) * TIMING["max_timeout"]
    bound = budget + TIMING["dead_path_s"] + heartbeat_s(c) + TIMING["max_timeout"] + SLACK
    fell_back_together(outcome, bound, "results lost")


def test_a_pause_is_no_dead_path(ranks):
    _, hooks = ranks

    def before(r: int) -> None:
        if r == 1:
            time.sleep(PAUSE)  # a checkpoint write before the backward pass

    outcome = step(hooks, before)
    for out, _ in outcome:
        np.testing.assert_array_equal(out, WORLD * CELLS)
    assert all(h.stats.fallbacks == 0 for h in hooks)
    assert max(t for _, t in outcome) >= PAUSE
