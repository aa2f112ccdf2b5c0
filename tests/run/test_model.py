"""The training tasks of `make run`: deterministic, sparse or dense as claimed, learnable."""

from __future__ import annotations

import pytest
import torch

from run.model import DEFAULT_LR, MODELS, JobShape, make_task


def _grads(task, rank: int, step: int) -> torch.Tensor:
    task.model.zero_grad()
    *inputs, labels = task.batch(rank, step)
    task.loss(task.model(*inputs), labels).backward()
    return torch.cat([p.grad.to_dense().reshape(-1) for p in task.model.parameters()])


@pytest.mark.parametrize("name", MODELS)
def test_tasks_are_deterministic_per_rank_and_step(name):
    a, b = make_task(name, JobShape()), make_task(name, JobShape())
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert torch.equal(_grads(a, 1, 3), _grads(b, 1, 3))
    assert not torch.equal(_grads(a, 1, 3), _grads(a, 2, 3))  # ranks see different data


def test_ncf_gradients_are_sparse_and_mlp_ones_dense():
    ncf, mlp = make_task("ncf", JobShape()), make_task("mlp", JobShape())
    assert ncf.sparse and not mlp.sparse
    assert ncf.model.user.weight.grad is None
    _grads(ncf, 0, 0)
    assert ncf.model.user.weight.grad.is_sparse and ncf.model.item.weight.grad.is_sparse
    assert (_grads(ncf, 0, 0) != 0).float().mean() < 0.05
    assert (_grads(mlp, 0, 0) != 0).float().mean() > 0.5


def test_ncf_dense_is_ncf_with_dense_tables():
    sparse, dense = make_task("ncf", JobShape()), make_task("ncf-dense", JobShape())
    assert dense.sparse  # its gradients still touch few rows
    for p, q in zip(sparse.model.parameters(), dense.model.parameters()):
        assert torch.equal(p, q)  # the same initial parameters
    got = _grads(dense, 0, 0)
    assert not dense.model.user.weight.grad.is_sparse
    assert torch.allclose(got, _grads(sparse, 0, 0), atol=1e-7)  # the same gradients
    assert (got != 0).float().mean() < 0.05


def test_mlp_learns_its_clusters():
    task = make_task("mlp", JobShape())
    opt = torch.optim.SGD(task.model.parameters(), lr=DEFAULT_LR["mlp"])
    losses = []
    for step in range(60):
        opt.zero_grad()
        *inputs, labels = task.batch(0, step)
        loss = task.loss(task.model(*inputs), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="unknown model"):
        make_task("resnet", JobShape())
