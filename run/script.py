"""`make run SCRIPT=path/to/train.py ARGS="..."` (`python -m run --script ... --script-args
...`): the user's own torchrun script, unchanged but for the two homagg lines, run in the
Mininet lab: once through the switch (every rank gets the controller, the run's CA and codec
from the environment, rank 0 the tenant credential that creates the job), then once over
gloo (HOMAGG_ATTACH=0: homagg.attach stays off, the script's own collectives). The script's
iteration times and losses are its own output, not known here: the summary shows what the
lab measures from outside (wall time, bytes each host sent, the switch counters) and the
plot the bytes each host sent per second over the run."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from homagg.environment import ATTACH_ENV, CODEC_ENV, CONTROLLER_ENV
from run.control import controller_address
from run.credentials import RunCredentials
from run.names import RunNames

# make run's own training options, which mean nothing to a foreign script: their defaults
# (python -m run's), so that one given with --script is refused rather than ignored
OWN_TRAINING_DEFAULTS = {
    "model": "ncf",
    "steps": 120,
    "batch": 64,
    "users": 20000,
    "items": 4000,
    "lr": None,
    "overlap": "blocking",
    "codec_option": [],
    "peers": "",
    "peers_first": False,
}


def check_script(args: argparse.Namespace) -> None:
    """--script's file and arguments (args.script made absolute, args.script_argv split as a
    shell would); ValueError names an option of make run's own model given with it."""
    if args.script is None:
        if args.script_args:
            raise ValueError("--script-args needs --script")
        return
    path = Path(args.script).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"--script {args.script}: no such file")
    args.script = path
    try:
        args.script_argv = shlex.split(args.script_args or "")
    except ValueError as exc:
        raise ValueError(f"--script-args {args.script_args!r}: {exc}") from None
    given = [k for k, v in OWN_TRAINING_DEFAULTS.items() if getattr(args, k) != v]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(
            f"{flags}: make run's own model and comparison runs, not a --script's (pass the "
            "script's own options in --script-args)"
        )


def script_command(
    args: argparse.Namespace, names: RunNames, rank: int, world_size: int, port: int
) -> list[str]:
    """torchrun of the user's script for host `rank` of `world_size` (rank 0's host is the
    rendezvous), with the script's own arguments."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(world_size)]
    cmd += ["--nproc-per-node", "1", "--node-rank", str(rank), "--master-addr", names.host_ip(0)]
    return [*cmd, "--master-port", str(port), str(args.script), *args.script_argv]


def script_env(
    mode: str, args: argparse.Namespace, names: RunNames, rank: int, creds: RunCredentials | None
) -> dict[str, str]:
    """What homagg.attach reads in a rank of the script: the switch run's controller, codec
    and CA (and rank 0's tenant credential, which creates the job), or for every other run
    HOMAGG_ATTACH=0."""
    if mode != "switch":
        return {ATTACH_ENV: "0"}
    env = {CONTROLLER_ENV: controller_address(names), CODEC_ENV: args.codec}
    return env | (creds.client_env(operator=rank == 0) if creds is not None else {})


def script_workdir(out: Path, mode: str) -> Path:
    """Where a run of the script works (its relative files land there): <out>/<mode>."""
    path = out / mode
    path.mkdir(parents=True, exist_ok=True)
    return path


def net_dev_tx_bytes(pid: int, iface: str) -> int:
    """Bytes interface `iface` of process `pid`'s network namespace sent (/proc/PID/net/dev)."""
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == iface:
            return int(counters.split()[8])
    raise ValueError(f"no interface {iface} in /proc/{pid}/net/dev")


@dataclass
class Traffic:
    """One run of the script as seen from outside: its wall time (torchrun's start to the
    last rank's exit, set-up included) and the bytes each host had sent, sampled."""

    seconds: float = 0.0
    samples: list[tuple[float, list[int]]] = field(default_factory=list)

    def bytes_per_host(self) -> float:
        """Mean bytes a host sent during the run."""
        if len(self.samples) < 2:
            return 0.0
        first, last = self.samples[0][1], self.samples[-1][1]
        return sum(b - a for a, b in zip(first, last)) / len(first)

    def rate(self) -> tuple[list[float], list[float]]:
        """(seconds since the start, bytes a host sent per second, mean over hosts) between
        successive samples."""
        xs, ys = [], []
        for (t0, b0), (t1, b1) in zip(self.samples, self.samples[1:]):
            if t1 > t0:
                xs.append(t1 - self.samples[0][0])
                ys.append(sum(y - x for x, y in zip(b0, b1)) / len(b0) / (t1 - t0))
        return xs, ys
