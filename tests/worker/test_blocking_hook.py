"""The blocking hook's held buckets (homagg/worker/ddp/blocking_hook.py): a step's small
buckets wait for its last one and go through the switch in one round with one verdict, up
to the state's `coalesce_cells`; a bucket past it goes after the held ones; a round that
falls back completes every held bucket by the process group; real DDP trains alike. In one
process (gloo, world size 1) with test_ddp_hook's fake agent."""

from __future__ import annotations

import pytest
import torch
from test_ddp_hook import (  # gloo: its world of one, for this module too
    Bucket,
    FakeAgent,
    embedding_grad,
    gloo,  # noqa: F401
    sparse_grad,
    train_sparse_net,
)

from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook


def step_buckets() -> list[torch.Tensor]:
    """A step of NCF's shape: a dense rest first, then two sparse tables (DDP's order)."""
    return [
        sparse_grad(3000, 1),
        embedding_grad(2000, 8, [3, 1999, 3, 40], seed=1),
        embedding_grad(500, 8, [0, 7], seed=2),
    ]


def hand_over(state: SwitchHookState, grads: list[torch.Tensor]) -> list:
    """The buckets handed to the hook in order, the last marked last; their Futures."""
    last = len(grads) - 1
    return [
        switch_allreduce_hook(state, Bucket(g.clone(), i, i == last)) for i, g in enumerate(grads)
    ]


def assert_sums(futs: list, grads: list[torch.Tensor]) -> None:
    for fut, g in zip(futs, grads, strict=True):
        out = fut.wait()
        assert out.is_sparse == g.is_sparse and out.shape == g.shape
        dense = out.to_dense() if out.is_sparse else out
        torch.testing.assert_close(dense, g.to_dense() if g.is_sparse else g)


def test_small_buckets_wait_for_the_last_and_share_one_round():
    agent = FakeAgent()
    state = SwitchHookState(agent, codec="lossless", world_size=1)
    grads = step_buckets()
    for step in range(2):
        futs = []
        for i, g in enumerate(grads):
            futs.append(switch_allreduce_hook(state, Bucket(g.clone(), i, i == 2)))
            if i < 2:  # held: nothing sent yet, DDP's Future pending
                assert not futs[-1].done() and agent.transport.runs == step
        assert all(f.done() for f in futs) and agent.transport.runs == step + 1
        assert_sums(futs, grads)
    # one verdict a step, three buckets summed by the switch each
    assert state.stats.switch_agreements == 2 and state.stats.switch_buckets == 6
    assert state.held == []
    state.close()


def test_no_coalescing_sends_every_bucket_alone():
    agent = FakeAgent()
    state = SwitchHookState(agent, codec="lossless", world_size=1, coalesce_cells=0)
    grads = step_buckets()
    futs = []
    for i, g in enumerate(grads):
        futs.append(switch_allreduce_hook(state, Bucket(g.clone(), i, i == 2)))
        assert futs[-1].done() and agent.transport.runs == i + 1
    assert_sums(futs, grads)
    assert state.stats.switch_agreements == 3
    state.close()


def test_a_bucket_past_the_cap_goes_after_the_held_ones():
    agent = FakeAgent()
    state = SwitchHookState(agent, codec="fixed_point", world_size=1, coalesce_cells=1000)
    grads = [sparse_grad(300, 3), sparse_grad(400, 4), sparse_grad(2000, 5), sparse_grad(10, 6)]
    futs = []
    runs = []
    for i, g in enumerate(grads):
        futs.append(switch_allreduce_hook(state, Bucket(g.clone(), i, i == 3)))
        runs.append(agent.transport.runs)
    # 300 + 400 held; 2,000 would pass 1,000: the two go, then the 2,000 alone (it reaches
    # the cap); the last bucket alone
    assert runs == [0, 0, 2, 3]
    assert [f.done() for f in futs] == [True] * 4
    for fut, g in zip(futs, grads):
        torch.testing.assert_close(fut.wait(), g, rtol=1e-6, atol=1e-7)
    state.close()


def test_a_round_that_falls_back_completes_every_held_bucket():
    agent = FakeAgent()
    agent.transport.broken = True
    state = SwitchHookState(agent, codec="lossless", world_size=1)
    grads = step_buckets()
    with pytest.warns(RuntimeWarning, match="switch path failed"):
        futs = hand_over(state, grads)
    assert_sums(futs, grads)
    assert agent.transport.runs == 1  # one round tried, for all three
    assert state.stats.fallback_buckets == 3 and state.stats.switch_buckets == 0
    state.close()


def test_while_falling_back_no_bucket_is_held():
    state = SwitchHookState(
        None, unavailable_reason="pool exhausted", world_size=1, cooldown_steps=3
    )
    grads = step_buckets()
    with pytest.warns(RuntimeWarning, match="pool exhausted"):
        futs = hand_over(state, grads)  # the first step agrees, at its round: fall back
    assert_sums(futs, grads)
    for i, g in enumerate(grads):  # the cool-down: each all_reduce starts at once
        fut = switch_allreduce_hook(state, Bucket(g.clone(), i, i == 2))
        assert state.held == []  # (held, its wait would never end before the last bucket)
        fut.wait()
    assert state.stats.fallback_buckets == 6


def test_an_error_in_the_round_reaches_every_held_future(monkeypatch):
    state = SwitchHookState(FakeAgent(), codec="lossless", world_size=1)

    def broken_use_switch() -> bool:
        raise RuntimeError("the last step's seal over the process group failed")

    grads = step_buckets()
    held = switch_allreduce_hook(state, Bucket(grads[0].clone(), 0, False))
    monkeypatch.setattr(state, "use_switch", broken_use_switch)
    with pytest.raises(RuntimeError, match="seal"):
        switch_allreduce_hook(state, Bucket(grads[1].clone(), 1, True))
    with pytest.raises(RuntimeError, match="seal"):
        held.wait()  # DDP's wait on the held bucket does not hang


def test_ddp_with_sparse_embeddings_sends_one_round_a_step():
    """Real DDP: NCF's shape (two sparse tables, a dense rest) in one round a step, and the
    parameters those of DDP over gloo after three SGD steps."""
    agent = FakeAgent()
    state = SwitchHookState(agent, world_size=1)
    for a, b in zip(train_sparse_net(state), train_sparse_net(None), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert agent.transport.runs == 3 and state.stats.switch_buckets == 9
