"""The DDP hook in one process (gloo, world size 1) with fake buckets and a fake agent whose
transport simulates the switch: switch path, averaging, bucket rebuilds, the fallback (warned
once, counted, chunks realigned, retried after the cool-down) and pickling."""

from __future__ import annotations

import pickle
import threading
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest
import torch
import torch.distributed as dist

from homagg.worker.codecs import CODECS, CodecEntry, SparseGrad, lane_codecs, make_codec
from homagg.worker.codecs.exponent import dense_exponents
from homagg.worker.codecs.lowbit import DEFAULT_LOWBIT_BLOCK, error_bound
from homagg.worker.codecs.simulate import drive
from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook
from homagg.worker.transport.switch_transport import TransportConfig, TransportError, TransportStats


@pytest.fixture(scope="module", autouse=True)
def gloo(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(params=[False, True], ids=["blocking", "async"])
def mode(request):
    """Each test in the blocking mode and in the asynchronous mode (communication thread)."""
    return request.param


class FakeTransport:
    """Drives codec generators like a switch with one worker; fails while `broken`."""

    def __init__(self) -> None:
        self.next_chunk = 0
        self.stats = TransportStats()
        self.config = TransportConfig(job_id=1, rank=0, world_size=1, pool_size=1)
        self.broken = False
        self.runs = 0

    def run(self, gen):
        self.runs += 1
        if self.broken:
            self.next_chunk += 3  # it got somewhere before timing out
            gen.close()
            raise TransportError("no result for chunk 3 of job 1 after 12 retransmissions")
        self.next_chunk += 1
        self.stats.packets_sent += 1
        return drive([gen])[0]


@dataclass
class FakeAgent:
    transport: FakeTransport = field(default_factory=FakeTransport)
    healthy: bool = True
    unhealthy_reason: str = ""
    told: list = field(default_factory=list)  # the give-ups this rank told its peers

    def tell_peers(self, gave_up) -> None:
        self.told.append(gave_up)


class Bucket:
    """What the hook uses of dist.GradBucket."""

    def __init__(self, tensor: torch.Tensor, index: int = 0, last: bool = True) -> None:
        self._t, self._i, self._last = tensor, index, last

    def buffer(self) -> torch.Tensor:
        return self._t

    def index(self) -> int:
        return self._i

    def is_last(self) -> bool:
        return self._last


def sparse_grad(n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = np.zeros(n, np.float32)
    idx = rng.choice(n, max(1, n // 20), replace=False)
    x[idx] = rng.normal(size=idx.size)
    return torch.from_numpy(x)


HOOK_CODECS = ["lossless", "fixed_point", *lane_codecs()]
LANE_BITS = {"lowbit16": 16, "lowbit8": 8}


def assert_codec_result(codec: str, out: torch.Tensor, summed: torch.Tensor, world: int) -> None:
    """`out` is the bucket's sum `summed` divided by `world`: to float32 rounding for the
    exact codecs, within the documented per-step bound for the lane codecs (per element
    W * 2^(E-P), E the block's exponent: docs/codecs.md), divided by W like the sum."""
    if codec not in LANE_BITS:
        torch.testing.assert_close(out, summed / world, rtol=1e-6, atol=1e-7)
        return
    x = summed.reshape(-1).to(torch.float32).numpy()
    exps = dense_exponents(x, DEFAULT_LOWBIT_BLOCK)
    bound = np.repeat(error_bound(world, exps, LANE_BITS[codec]), DEFAULT_LOWBIT_BLOCK)
    err = (out.reshape(-1).double() - summed.reshape(-1).double() / world).abs().numpy()
    assert np.all(err <= bound[: x.size] / world), f"max error {err.max():.3g} over the bound"
    assert err.max() > 0  # lossy: the check above is not of an exact result


@pytest.mark.parametrize("codec", HOOK_CODECS)
def test_switch_path_returns_the_sum_divided_by_world(codec, mode):
    state = SwitchHookState(FakeAgent(), codec=codec, world_size=1, asynchronous=mode)
    g = sparse_grad(5000, 1)
    out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert out.shape == g.shape and out.dtype == g.dtype
    assert_codec_result(codec, out, g, 1)
    assert state.stats.switch_buckets == 1 and state.stats.fallback_buckets == 0
    # the first agreement; the bucket's outcome by its verdict packet, the step's seal
    # started over the process group and read by close() (or the next bucket)
    state.wait_idle(10)
    assert state.stats.agreements == 1 and state.stats.switch_agreements == 1
    state.close()
    assert state.stats.agreements == 2 and state.fallback.pending is None


@pytest.mark.parametrize("codec", HOOK_CODECS)
def test_world_size_divides_and_shapes_dtypes_are_kept(codec, mode):
    state = SwitchHookState(FakeAgent(), codec=codec, world_size=4, asynchronous=mode)
    g = torch.linspace(-1, 1, 3000, dtype=torch.float64).reshape(3, 1000)
    out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert out.shape == (3, 1000) and out.dtype == torch.float64
    assert_codec_result(codec, out, g, 4)


@pytest.mark.parametrize("codec", lane_codecs())
def test_lane_codecs_stay_within_the_bound_every_step(codec, mode):
    """Through the hook, over several steps, with error feedback at gamma = 1 (option
    `gamma`): the sums telescope, so what was applied differs from the sum of the gradients
    by the last step's residual only, at most one quantum 2^(E-P) per element (E: the block
    exponent of g + e, at most one above the gradients')."""
    state = SwitchHookState(
        FakeAgent(), codec=codec, world_size=1, asynchronous=mode, codec_options={"gamma": 1.0}
    )
    rng = np.random.default_rng(5)
    applied, given = np.zeros(4096), np.zeros(4096)
    top = np.full(4096 // DEFAULT_LOWBIT_BLOCK, -126)
    for step in range(6):
        g = torch.from_numpy((rng.standard_normal(4096) * 10.0**-step).astype(np.float32))
        top = np.maximum(top, dense_exponents(g.numpy(), DEFAULT_LOWBIT_BLOCK))
        out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
        applied += out.double().numpy()
        given += g.double().numpy()
    bound = np.repeat(error_bound(1, top + 1, LANE_BITS[codec]), DEFAULT_LOWBIT_BLOCK)
    assert np.all(np.abs(applied - given) <= bound)
    assert state.stats.switch_buckets == 6


def test_rebuilt_buckets_get_new_codecs(mode):
    agent = FakeAgent()
    state = SwitchHookState(agent, codec="lossless", world_size=1, asynchronous=mode)
    for n in (100, 100, 250):
        switch_allreduce_hook(state, Bucket(sparse_grad(n, n), index=0)).wait()
        assert state.codecs.held[(0, "lossless")][0] == n
    assert agent.transport.runs == 3


def test_no_agent_falls_back_to_gloo_and_warns_once(mode):
    state = SwitchHookState(
        None, unavailable_reason="pool exhausted: RESOURCE_EXHAUSTED", asynchronous=mode
    )
    g = sparse_grad(1000, 2)
    with pytest.warns(RuntimeWarning, match="pool exhausted"):
        out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    torch.testing.assert_close(out, g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(12):
            switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert state.stats.fallback_buckets == 13 and state.stats.switch_buckets == 0


def test_timeout_falls_back_realigns_and_retries_after_cooldown(mode):
    agent = FakeAgent()
    state = SwitchHookState(agent, codec="fixed_point", cooldown_steps=2, asynchronous=mode)
    g = sparse_grad(800, 3)
    switch_allreduce_hook(state, Bucket(g.clone())).wait()
    agent.transport.broken = True
    with pytest.warns(RuntimeWarning, match="switch path failed"):
        out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    torch.testing.assert_close(out, g)  # the bucket was redone by gloo
    assert agent.transport.next_chunk == 6  # past the agreed (max) counter: 1 + 1 + 3, + 1
    runs = agent.transport.runs
    for _ in range(2):  # the cool-down: no switch attempt
        switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert agent.transport.runs == runs
    agent.transport.broken = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert agent.transport.runs == runs + 1
    torch.testing.assert_close(out, g, rtol=1e-6, atol=1e-7)
    assert state.stats.fallbacks == 1 and state.stats.fallback_buckets == 3
    assert state.stats.fallback_reasons["the switch path failed (TransportError)"] == 1


def test_unhealthy_agent_is_not_used_and_healthy_again_is(mode):
    agent = FakeAgent(healthy=False, unhealthy_reason="Heartbeat failed: UNAVAILABLE")
    state = SwitchHookState(agent, codec="lossless", cooldown_steps=0, asynchronous=mode)
    g = sparse_grad(500, 4)
    with pytest.warns(RuntimeWarning, match="UNAVAILABLE"):
        switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert agent.transport.runs == 0
    agent.healthy = True  # cooldown_steps=0: agreed again from the next step
    switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert agent.transport.runs == 1 and state.stats.switch_buckets == 1


def test_codec_error_falls_back(mode):
    state = SwitchHookState(FakeAgent(), codec="fixed_point", asynchronous=mode)
    g = sparse_grad(500, 5)
    g[7] = float("nan")
    with pytest.warns(RuntimeWarning, match="codec error"):
        out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert torch.isnan(out[7]) and state.stats.fallbacks == 1


def test_state_pickles_without_agent(mode):
    state = SwitchHookState(FakeAgent(), codec="lossless", world_size=1, asynchronous=mode)
    switch_allreduce_hook(state, Bucket(sparse_grad(100, 6))).wait()
    copy = pickle.loads(pickle.dumps(state))
    assert copy.agent is None and copy.codecs.held == {} and copy.stats.switch_buckets == 1
    with pytest.warns(RuntimeWarning, match="unpickled"):
        switch_allreduce_hook(copy, Bucket(sparse_grad(100, 6))).wait()
    copy.attach(FakeAgent())
    switch_allreduce_hook(copy, Bucket(sparse_grad(100, 6))).wait()
    assert copy.stats.switch_buckets == 2


def embedding_grad(rows: int, dim: int, touched: list[int], seed: int) -> torch.Tensor:
    """A gradient as nn.Embedding(sparse=True) makes it: uncoalesced, repeated rows."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.tensor([touched])
    return torch.sparse_coo_tensor(idx, torch.randn(len(touched), dim, generator=g), (rows, dim))


@pytest.mark.parametrize("codec", ["lossless", "fixed_point"])
def test_sparse_bucket_goes_through_the_switch_and_stays_sparse(codec):
    agent = FakeAgent()
    state = SwitchHookState(agent, codec=codec, world_size=1)
    g = embedding_grad(1000, 8, [5, 900, 5, 17], seed=1)
    out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert out.is_sparse and out.shape == g.shape and out.dtype == g.dtype
    assert sorted(out.coalesce().indices()[0].tolist()) == [5, 17, 900]
    torch.testing.assert_close(out.to_dense(), g.to_dense(), rtol=1e-6, atol=1e-7)
    assert agent.transport.runs == 1 and state.stats.switch_buckets == 1
    assert state.stats.dense_bytes == 1000 * 8 * 4


class Spy:
    """A codec that records what the hook hands it, then sums like the lossless codec."""

    seen: ClassVar[list] = []

    def __init__(self, world: int, rank: int) -> None:
        self.inner = make_codec("lossless", world, rank)

    def aggregate(self, x):
        Spy.seen.append(x)
        return self.inner.aggregate(x)


def test_the_codec_gets_indices_and_values_not_a_dense_array(monkeypatch):
    monkeypatch.setitem(CODECS, "spy", CodecEntry(Spy))
    Spy.seen = []
    state = SwitchHookState(FakeAgent(), codec="spy", world_size=1)
    g = torch.sparse_coo_tensor([[5, 900, 5]], torch.ones(3, 8), (100_000, 8))
    out = switch_allreduce_hook(state, Bucket(g)).wait()
    [x] = Spy.seen
    assert isinstance(x, SparseGrad) and x.length == 800_000
    assert x.indices.size == x.values.size == 2 * 8  # two rows of 8, coalesced
    assert out.coalesce().indices()[0].tolist() == [5, 900]


def test_sparse_bucket_falls_back_to_gloo_sparse():
    agent = FakeAgent()
    agent.transport.broken = True
    state = SwitchHookState(agent, codec="lossless", world_size=1)
    g = embedding_grad(50, 4, [1, 2], seed=2)
    with pytest.warns(RuntimeWarning, match="switch path failed"):
        out = switch_allreduce_hook(state, Bucket(g.clone())).wait()
    assert out.is_sparse
    torch.testing.assert_close(out.to_dense(), g.to_dense())


class SparseNet(torch.nn.Module):
    """nn.Embedding(sparse=True), nn.EmbeddingBag(sparse=True) and a dense layer: DDP gives
    it three buckets, two of them sparse."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(300, 6, sparse=True)
        self.bag = torch.nn.EmbeddingBag(200, 6, sparse=True, mode="sum")
        self.out = torch.nn.Linear(6, 1)

    def forward(self, ids: torch.Tensor, bag: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids) + self.bag(bag))


def train_sparse_net(state: SwitchHookState | None, steps: int = 3) -> list[torch.Tensor]:
    """SparseNet's parameters after `steps` SGD steps under DDP (through DDP's forward, so
    that its reducer calls the hook), with the hook of `state`, or over gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = SparseNet()
    ddp = DDP(m)
    if state is not None:
        ddp.register_comm_hook(state, switch_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 300, (16,), generator=g)
        bag = torch.randint(0, 200, (16, 3), generator=g)
        opt.zero_grad()
        ddp(ids, bag).sum().backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def test_ddp_with_sparse_embeddings_matches_gloo():
    """A real DDP model with nn.Embedding(sparse=True) and nn.EmbeddingBag(sparse=True): the
    hook's parameters after three SGD steps equal those of DDP over gloo."""
    agent = FakeAgent()
    state = SwitchHookState(agent, world_size=1, coalesce_cells=0)
    for a, b in zip(train_sparse_net(state), train_sparse_net(None), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert state.stats.switch_buckets == 9 and agent.transport.runs == 9  # DDP used the hook


class GatedTransport(FakeTransport):
    """A transport that waits for `gate` before each run and notes the thread and order."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.order: list[int] = []
        self.threads: set[str] = set()

    def run(self, gen):
        assert self.gate.wait(10), "the test never opened the gate"
        self.threads.add(threading.current_thread().name)
        self.order.append(self.runs)
        return super().run(gen)


def test_async_hook_returns_pending_futures_completed_in_order_by_one_thread():
    agent = FakeAgent(transport=GatedTransport())
    state = SwitchHookState(agent, codec="lossless", world_size=1, asynchronous=True)
    grads = [sparse_grad(300, 10 + i) for i in range(4)]
    futs = [
        switch_allreduce_hook(state, Bucket(g.clone(), index=i, last=i == 3))
        for i, g in enumerate(grads)
    ]
    assert not any(f.done() for f in futs)  # backward goes on while the buckets wait
    agent.transport.gate.set()
    for f, g in zip(futs, grads):
        torch.testing.assert_close(f.wait(), g, rtol=1e-6, atol=1e-7)
    assert agent.transport.order == [0, 1, 2, 3]
    assert agent.transport.threads == {f"homagg-comm-{state.rank}"}
    assert state.group is not None and state.group != dist.group.WORLD  # its own group
    assert state.wait_idle(10)  # the step's end is a job of its own, after the last bucket
    assert state.steps == 1 and state.stats.switch_buckets == 4
    state.close()


def test_async_hook_failure_of_the_job_reaches_the_waiter():
    state = SwitchHookState(FakeAgent(), codec="lossless", world_size=1, asynchronous=True)
    bad = Bucket(torch.zeros(1))
    bad.buffer = lambda: "not a tensor"  # type: ignore[method-assign]
    fut = switch_allreduce_hook(state, bad)
    with pytest.raises((AttributeError, RuntimeError), match=r"detach|is_sparse"):
        fut.wait()
    ok = switch_allreduce_hook(state, Bucket(sparse_grad(100, 7)))  # the thread lives on
    torch.testing.assert_close(ok.wait(), sparse_grad(100, 7), rtol=1e-6, atol=1e-7)
    state.close()
