"""The `make run`s in Mininet that several tests of tests/run check (mininet_runs.py): each
group starts its runs at once, once per session, so the tests pay Mininet, the controller,
torchrun and the plot once for every check of a run."""

from __future__ import annotations

import pytest
from mininet_runs import MLP, ROOT, TWO_HOSTS, Run, runs_together, tree_run


@pytest.fixture(scope="session")
def auto_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The MLP for 12 steps in DeAR mode with the fixed-point codec (and its gloo run), and
    codec="auto" with the asynchronous hook and in DeAR mode (no gloo run), at once:
    test_overlap_runs checks each, test_two_runs that the auto runs finished apart."""
    runs = {
        "dear": [*MLP, "--overlap", "dear", "--codec", "fixed_point"],
        "auto": [*MLP, "--codec", "auto", "--no-gloo"],
        "auto-dear": [*MLP, "--codec", "auto", "--overlap", "dear", "--no-gloo"],
    }
    return runs_together(runs, tmp_path_factory.mktemp("auto-runs"))


@pytest.fixture(scope="session")
def training_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """make run's default job shortened (NCF, 40 steps) and make run TOPO=two-level with the
    dense MLP (8 hosts, 8 steps), each with its gloo run, and examples/train_ddp.py as
    `--script` (its switch run only), at once (test_make_run)."""
    example = str(ROOT / "examples" / "train_ddp.py")
    runs = {
        "ncf": [*TWO_HOSTS, "--steps", "40", "--users", "2000", "--items", "500", "--lr", "2"],
        "tree": tree_run(),
        "script": [
            *TWO_HOSTS,
            "--no-gloo",
            "--script",
            example,
            "--script-args",
            "--steps 6 --save model.pt",
        ],
    }
    return runs_together(runs, tmp_path_factory.mktemp("training-runs"))
