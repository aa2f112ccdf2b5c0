"""The training jobs of `make run`, deterministic per (seed, rank, step): an NCF-style
recommender (user and item embedding tables, a small MLP) on synthetic implicit feedback,
whose gradients touch few rows (in sparse tensors, or dense tables with `ncf-dense`), a
small dense MLP classifier on synthetic clusters, and a small transformer language model
on a synthetic token chain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class JobShape:
    """Sizes of the model and of each rank's batch."""

    users: int = 20000
    items: int = 4000
    dim: int = 16
    batch: int = 64
    negatives: int = 1  # sampled negatives per positive
    seed: int = 0
    features: int = 64  # dense model: inputs, hidden width and classes
    hidden: int = 256
    classes: int = 10
    vocab: int = 256  # language model: tokens, width, layers, heads, sequence length
    width: int = 64
    layers: int = 2
    heads: int = 4
    seq: int = 32


class NCF(nn.Module):
    """Neural collaborative filtering: embeddings into an MLP scoring a user-item pair. The
    embeddings' gradients touch only the batch's rows: with `sparse` PyTorch makes them
    sparse COO tensors, as recommenders tuned for it do, and DDP gives each its own
    bucket; without (nn.Embedding's default, what an ordinary script runs) they are dense
    tables, mostly zeros, in DDP's buckets with the rest."""

    def __init__(self, shape: JobShape, sparse: bool = True) -> None:
        super().__init__()
        self.user = nn.Embedding(shape.users, shape.dim, sparse=sparse)
        self.item = nn.Embedding(shape.items, shape.dim, sparse=sparse)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        self.mlp = nn.Sequential(nn.Linear(2 * shape.dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Logits of the pairs."""
        return self.mlp(torch.cat([self.user(users), self.item(items)], dim=1)).squeeze(1)


class Feedback:
    """Synthetic implicit feedback: hidden user and item factors and item popularity decide
    which items a user interacts with; users and items are drawn Zipf-like (a few heavy)."""

    def __init__(self, shape: JobShape) -> None:
        g = torch.Generator().manual_seed(shape.seed + 12345)
        self.shape = shape
        self.u = torch.randn(shape.users, 8, generator=g)
        self.v = torch.randn(shape.items, 8, generator=g)
        self.pop = torch.randn(shape.items, generator=g) * 1.5
        self.user_w = 1.0 / torch.arange(1, shape.users + 1, dtype=torch.float64) ** 0.8
        self.item_w = 1.0 / torch.arange(1, shape.items + 1, dtype=torch.float64) ** 0.8

    def batch(self, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(users, items, labels) of one rank at one step: positives drawn from the hidden
        preference, and uniformly sampled items as negatives."""
        s = self.shape
        g = torch.Generator().manual_seed(s.seed * 1_000_003 + rank * 10_007 + step)
        users = torch.multinomial(self.user_w, s.batch, replacement=True, generator=g)
        cand = torch.multinomial(self.item_w, s.batch * 8, replacement=True, generator=g).view(
            s.batch, 8
        )
        score = (self.u[users].unsqueeze(1) * self.v[cand]).sum(-1) + self.pop[cand]
        pos = cand.gather(1, score.argmax(1, keepdim=True)).squeeze(1)
        neg = torch.randint(0, s.items, (s.batch * s.negatives,), generator=g)
        all_users = torch.cat([users, users.repeat(s.negatives)])
        items = torch.cat([pos, neg])
        labels = torch.cat([torch.ones(s.batch), torch.zeros(s.batch * s.negatives)])
        return all_users, items, labels


class MLP(nn.Module):
    """The small dense model: two hidden ReLU layers; every gradient element is nonzero."""

    def __init__(self, shape: JobShape) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(shape.features, shape.hidden),
            nn.ReLU(),
            nn.Linear(shape.hidden, shape.hidden),
            nn.ReLU(),
            nn.Linear(shape.hidden, shape.classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.net(x)


class Clusters:
    """Synthetic classification: one Gaussian cluster per class around a hidden mean."""

    def __init__(self, shape: JobShape) -> None:
        g = torch.Generator().manual_seed(shape.seed + 54321)
        self.shape = shape
        self.means = torch.randn(shape.classes, shape.features, generator=g)

    def batch(self, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, class labels) of one rank at one step."""
        s = self.shape
        g = torch.Generator().manual_seed(s.seed * 1_000_003 + rank * 10_007 + step)
        labels = torch.randint(0, s.classes, (s.batch,), generator=g)
        x = self.means[labels] + 1.5 * torch.randn(s.batch, s.features, generator=g)
        return x, labels


class TinyLM(nn.Module):
    """A small causal transformer language model: token and position embeddings, pre-norm
    encoder layers under a causal mask, a linear head; gradients dense but for the rows of
    the tokens a batch holds."""

    mask: torch.Tensor  # the causal mask, a buffer (moves with the module)

    def __init__(self, shape: JobShape) -> None:
        super().__init__()
        self.tok = nn.Embedding(shape.vocab, shape.width)
        self.pos = nn.Embedding(shape.seq, shape.width)
        layer = nn.TransformerEncoderLayer(
            shape.width,
            shape.heads,
            4 * shape.width,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, shape.layers, enable_nested_tensor=False)
        self.head = nn.Linear(shape.width, shape.vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(shape.seq))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits, (batch * seq, vocab)."""
        n = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(n))
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.head(h).reshape(-1, self.head.out_features)


class TokenChain:
    """Synthetic text: a random sparse Markov chain (each token has 4 likely successors)."""

    def __init__(self, shape: JobShape) -> None:
        g = torch.Generator().manual_seed(shape.seed + 777)
        self.shape = shape
        self.next = torch.randint(0, shape.vocab, (shape.vocab, 4), generator=g)

    def batch(self, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input tokens, next tokens flattened) of one rank at one step."""
        s = self.shape
        g = torch.Generator().manual_seed(s.seed * 1_000_003 + rank * 10_007 + step)
        seqs = torch.empty(s.batch // 4, s.seq + 1, dtype=torch.int64)
        seqs[:, 0] = torch.randint(0, s.vocab, (seqs.shape[0],), generator=g)
        pick = torch.randint(0, 4, seqs.shape, generator=g)
        for t in range(1, s.seq + 1):
            seqs[:, t] = self.next[seqs[:, t - 1], pick[:, t]]
        return seqs[:, :-1], seqs[:, 1:].reshape(-1)


@dataclass
class Task:
    """A model, its data and its loss: what one training step needs."""

    model: nn.Module
    batch: Callable[[int, int], tuple[torch.Tensor, ...]]  # (rank, step) -> (*inputs, labels)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    sparse: bool  # gradients touch few rows (in sparse tensors or not)


MODELS = ("ncf", "ncf-dense", "mlp", "lm")
# SGD; NCF's mean loss spreads over many rows
DEFAULT_LR = {"ncf": 3.0, "ncf-dense": 3.0, "mlp": 0.1, "lm": 0.5}


def make_task(name: str, shape: JobShape) -> Task:
    """The task by name: "ncf" (sparse embedding gradients, BCE), "ncf-dense" (the same
    with dense tables), "mlp" (dense, cross-entropy) or "lm"; parameters initialised from
    shape.seed, alike on every rank."""
    torch.manual_seed(shape.seed)
    if name in ("ncf", "ncf-dense"):
        model = NCF(shape, sparse=name == "ncf")
        loss = nn.functional.binary_cross_entropy_with_logits
        return Task(model, Feedback(shape).batch, loss, True)
    if name == "mlp":
        return Task(MLP(shape), Clusters(shape).batch, nn.functional.cross_entropy, False)
    if name == "lm":
        return Task(TinyLM(shape), TokenChain(shape).batch, nn.functional.cross_entropy, False)
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
