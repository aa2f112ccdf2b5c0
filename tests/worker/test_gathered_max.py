"""The agreements' MAX by one all_gather (homagg/worker/ddp/gathered_max.py): the element-wise
MAX of every rank's vector, written only once the gather is waited for, a timeout passed to
the gather's Work; and the same as gloo's MAX all_reduce over real gloo ranks (threads)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from homagg.lab.threads import run_threads
from homagg.worker.ddp.gathered_max import start_gathered_max, start_max_over

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class FakeWork:
    def __init__(self, fill) -> None:
        self.fill, self.timeouts = fill, []

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.timeouts.append(timeout)
        self.fill()
        return True


def test_the_max_of_every_rank_is_written_when_waited_for():
    ranks = [
        torch.tensor([3, -5, INT64_MIN, 0], dtype=torch.int64),
        torch.tensor([-1, -7, INT64_MAX, 0], dtype=torch.int64),
        torch.tensor([2, -6, 0, 0], dtype=torch.int64),
    ]
    mine = ranks[0].clone()
    works: list[FakeWork] = []

    def gather(parts, x):
        assert x is mine and len(parts) == 3

        def fill() -> None:
            for p, r in zip(parts, ranks, strict=True):
                p.copy_(r)

        works.append(FakeWork(fill))
        return works[-1]

    started = start_gathered_max(mine, 3, gather)
    assert mine.tolist() == [3, -5, INT64_MIN, 0]  # nothing until waited for
    assert started.wait(timedelta(seconds=2))
    assert mine.tolist() == [3, -5, INT64_MAX, 0]
    assert works[0].timeouts == [timedelta(seconds=2)]


def test_it_agrees_with_gloos_max_all_reduce(tmp_path):
    world = 3
    store = dist.FileStore(str(tmp_path / "store"), world)

    def rank(r: int) -> tuple[list[int], list[int]]:
        pg = dist.ProcessGroupGloo(store, r, world, timedelta(seconds=30))
        g = torch.Generator().manual_seed(r)
        vec = torch.randint(-1000, 1000, (8,), generator=g, dtype=torch.int64)
        gathered = vec.clone()
        start_max_over(pg, gathered).wait()
        reduced = vec.clone()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        pg.allreduce([reduced], opts).wait()
        return gathered.tolist(), reduced.tolist()

    _, results = run_threads([lambda r=r: rank(r) for r in range(world)], 60)
    for gathered, reduced in results:
        assert gathered == reduced == results[0][1]
