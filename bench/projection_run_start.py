"""Starting the Mininet training runs that the projection is checked against
(bench/projection_runs.py): `python -m run` with the dense MLP, fixed point, blocking, its
printed output saved as run.log in its directory and the machine's load sampled meanwhile
as load.jsonl (bench/run_load.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.projection_model import ModelError
from bench.projection_runs import LOAD_LOG, RUN_LOG
from bench.run_load import LoadSampler
from homagg.control.config import ControllerConfig


@dataclass(frozen=True)
class RunSpec:
    """A run to start: switch target, topology ('star': 4 unshaped hosts, 'star<N>': N of
    them, else a --topo of python -m run), steps, pool slots a rank."""

    target: str = "refswitch"
    topo: str = "star"
    steps: int = 12
    pool_size: int = ControllerConfig.default_pool_size  # make run's

    @property
    def name(self) -> str:
        """The run's directory name: target, topology, pool."""
        return f"{self.target}-{self.topo}-pool{self.pool_size}"

    def command(self, out: Path) -> list[str]:
        """The `python -m run` arguments: the dense MLP, fixed point, blocking."""
        cmd = ["-m", "run", "--target", self.target, "--model", "mlp", "--codec", "fixed_point"]
        cmd += ["--steps", str(self.steps), "--pool-size", str(self.pool_size)]
        hosts = star_hosts(self.topo)
        cmd += ["--hosts", str(hosts)] if hosts else ["--topo", self.topo]
        return [*cmd, "--no-plot", "--out", str(out)]


def star_hosts(topo: str) -> int:
    """The hosts of a star topology name ('star': 4, 'star<N>': N); 0 for any other name."""
    if topo == "star":
        return 4
    rest = topo.removeprefix("star")
    return int(rest) if rest != topo and rest.isdigit() and int(rest) > 0 else 0


def start_run(out: Path, spec: RunSpec) -> Path:
    """Run `python -m run` (root, Mininet) per `spec`, its printed output saved as run.log
    in `out` and the machine's load meanwhile as load.jsonl (bench/run_load.py); raises
    when the run fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = spec.command(out)
    print(f"projection runs: python {' '.join(cmd)}", flush=True)
    saved = out.parent / f"{out.name}.{RUN_LOG}"  # the run empties its --out as it starts
    load = out.parent / f"{out.name}.{LOAD_LOG}"
    with open(saved, "w") as log:
        proc = subprocess.Popen([sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT)
        sampler = LoadSampler(load, proc.pid, out)
        try:
            returncode = proc.wait(timeout=1800)
        finally:
            sampler.stop()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    saved.replace(out / RUN_LOG)
    load.replace(out / LOAD_LOG)
    # exit 1: the parameter check said DIFFER; the run itself completed
    if returncode not in (0, 1):
        raise ModelError(f"`python -m run` failed ({returncode}): see {out / RUN_LOG}")
    return out
