"""What a torchrun command line says about the job homagg-run makes for it, read with
torchrun's own argument parser: how many ranks it starts, and whether its node is the one
whose rank 0 takes the launcher's job.

One job serves the ranks of every node: rank 0 reads its id and token from the launcher's
environment and hands them to the other ranks through torch.distributed's store. So
homagg-run wraps one torchrun, the one of node rank 0; a launcher around another node's
torchrun would make a job nobody joins.

torchrun's parser is torch.distributed.run's, so reading a torchrun's options imports torch
(in the launcher's process, before it makes the job); nothing else here does, and the
launcher imports this module without it."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class Torchrun:
    """torchrun's reading of its options: nodes (min, max), ranks per node (None when
    torchrun decides them: auto, cpu, gpu), this node's rank, the rendezvous backend."""

    nodes: tuple[int, int]
    per_node: int | None
    node_rank: int
    rendezvous: str
    standalone: bool

    @property
    def world_size(self) -> int | None:
        """The ranks it starts in total, when its options fix them."""
        lo, hi = self.nodes
        return lo * self.per_node if lo == hi and self.per_node is not None else None

    @property
    def dynamic_ranks(self) -> bool:
        """Whether rendezvous, not --node-rank, decides which node gets rank 0."""
        return self.rendezvous != "static" and not self.standalone and self.nodes != (1, 1)


def read_torchrun(command: Sequence[str]) -> Torchrun | None:
    """The command's torchrun options (`torchrun ...`, `python -m torch.distributed.run
    ...`), or None when it is something else or torchrun itself would refuse it."""
    tail = _torchrun_arguments(command)
    if tail is None:
        return None
    from torch.distributed.run import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # torchrun says it better itself
            args = get_args_parser().parse_args(tail)
        lo, _, hi = str(args.nnodes).partition(":")
        nodes = (int(lo), int(hi or lo))
    except (SystemExit, ValueError):
        return None
    per_node = int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else None
    return Torchrun(nodes, per_node, int(args.node_rank), args.rdzv_backend, args.standalone)


def _torchrun_arguments(command: Sequence[str]) -> list[str] | None:
    if not command:
        return None
    if Path(command[0]).name == "torchrun":
        return list(command[1:])
    for i, word in enumerate(command[:-1]):
        if word == "-m" and command[i + 1] in RUN_MODULES:
            return list(command[i + 2 :])
    return None


def plan_world(world_size: int | None, command: Sequence[str]) -> tuple[int, list[str]]:
    """The job's world size (--world-size, else torchrun's) and notes for the user;
    raises ValueError with what to do when the command is one a job cannot serve."""
    run = read_torchrun(command)
    if run is None:
        if world_size is None:
            raise ValueError("give --world-size: the command is not a torchrun that fixes it")
        return world_size, []
    if run.node_rank != 0 and not run.dynamic_ranks:
        raise ValueError(
            f"this torchrun is node rank {run.node_rank}: run homagg-run once, around the "
            "torchrun of node rank 0, and torchrun alone on the other nodes (with "
            f"HOMAGG_CONTROLLER set: their ranks get the job from rank 0); see {_DOC}"
        )
    world = run.world_size
    if world_size is None and world is None:
        raise ValueError(
            "give --world-size: torchrun's --nnodes and --nproc-per-node do not fix the ranks"
        )
    if world_size is not None and world is not None and world_size != world:
        raise ValueError(
            f"--world-size {world_size}, but torchrun starts {run.nodes[0]} node(s) x "
            f"{run.per_node} = {world} ranks"
        )
    size = world_size if world_size is not None else world
    assert size is not None
    notes = []
    if run.dynamic_ranks:
        notes.append(
            f"rendezvous {run.rendezvous!r} decides which node gets rank 0: if it is not this "
            "one, the ranks make a job of their own and this one goes unused"
        )
    if run.nodes[1] > 1:
        notes.append(
            "start torchrun on the other nodes yourself, with HOMAGG_CONTROLLER (and "
            "HOMAGG_CA_FILE) set as here: their ranks get this job from rank 0"
        )
    return size, notes


_DOC = "docs/worker.md, 'homagg-run on several machines'"
