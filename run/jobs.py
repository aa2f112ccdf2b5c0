"""The training jobs of a `make run`: one torchrun per worker host (rank = host index,
rank 0's host the rendezvous) of run.train or of the user's --script (run/script.py), rank
0's lines followed and each host's bytes sampled, and the order of the runs: the switch run
(then the switch counters), DDP over gloo and the peer methods."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from homagg.lab import REPO_ROOT
from run.control import controller_address, counters
from run.credentials import RunCredentials
from run.names import RunNames
from run.script import Traffic, net_dev_tx_bytes, script_command, script_env, script_workdir
from run.state import RunState

if TYPE_CHECKING:
    from mininet.net import Mininet

# torchrun's rendezvous port on rank 0's host: its default for the switch run, the ports
# after it for the others (each job its own, so a late socket of one never meets the next).
SWITCH_RENDEZVOUS_PORT = 29500
LOG_TAIL_CHARS = 2500  # of a failed rank's log, in the error
# torchrun's report of a worker killed by a signal: "exitcode  : -6 (pid: 123)"
_SIGNALLED = re.compile(r"exitcode\s*:\s*-(\d+)\b")


class RankSignalled(RuntimeError):
    """A run failed because a rank's process was killed by a signal (SIGSEGV, SIGABRT, ...):
    a crash in native code, not an error the training raised."""

    def __init__(self, message: str, signals: list[str]) -> None:
        super().__init__(message)
        self.signals = signals


def rank_command(
    mode: str,
    args: argparse.Namespace,
    names: RunNames,
    rank: int,
    world_size: int,
    port: int,
    iface: str,
) -> list[str]:
    """torchrun of run.train for host `rank` of `world_size` (rank 0's host is the master),
    counting the bytes sent on `iface`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(world_size)]
    cmd += ["--nproc-per-node", "1", "--node-rank", str(rank), "--master-addr", names.host_ip(0)]
    cmd += ["--master-port", str(port), "-m", "run.train", "--mode", mode]
    cmd += ["--codec", args.codec, "--overlap", args.overlap, "--model", args.model]
    cmd += [arg for kv in args.codec_option for arg in ("--codec-option", kv)]
    cmd += ["--steps", str(args.steps), "--users", str(args.users), "--items", str(args.items)]
    cmd += ["--batch", str(args.batch), "--lr", str(args.lr), "--iface", iface]
    cmd += ["--out", str(args.out)]
    if mode == "switch":
        cmd += ["--controller", controller_address(names)]
        cmd += ["--pool-size", str(args.pool_size)]
    return cmd


def _launch(
    mode: str,
    args: argparse.Namespace,
    names: RunNames,
    rank: int,
    world_size: int,
    port: int,
    iface: str,
    creds: RunCredentials | None,
) -> tuple[list[str], dict[str, str], Path]:
    """A rank's command, its environment beside os.environ's, and its working directory:
    run.train's, or with --script the user's script's (run/script.py)."""
    if args.script is not None:
        cmd = script_command(args, names, rank, world_size, port)
        return cmd, script_env(mode, args, names, rank, creds), script_workdir(args.out, mode)
    cmd = rank_command(mode, args, names, rank, world_size, port, iface)
    return cmd, creds.client_env(operator=rank == 0) if creds is not None else {}, REPO_ROOT


def run_job(
    mode: str,
    net: Mininet,
    args: argparse.Namespace,
    state: RunState,
    port: int,
    creds: RunCredentials | None = None,
) -> Traffic:
    """One torchrun per host (rank = host index), rank 0's output streamed here; returns its
    wall time and the bytes each host sent, sampled. With `creds` every rank verifies the
    controller against the run's CA and rank 0, which creates the job, reads the tenant
    credential from its file (the environment names the files)."""
    hosts = [h for h in net.hosts if h.inNamespace]
    procs, logs = [], []
    traffic = Traffic()
    ifaces = [(h.pid, h.defaultIntf().name) for h in hosts]
    start = time.monotonic()
    for i, h in enumerate(hosts):
        iface = h.defaultIntf().name
        cmd, extra, cwd = _launch(mode, args, state.names, i, len(hosts), port, iface, creds)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "GLOO_SOCKET_IFNAME": iface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            # a rank killed by a signal (SIGSEGV, SIGABRT) prints its threads' Python
            # stacks into its log: where a crash in native code was called from
            "PYTHONFAULTHANDLER": "1",
            **extra,
        }
        logs.append(args.out / f"{mode}-rank{i}.log")
        with open(logs[-1], "wb") as rank_log:  # the rank keeps its own descriptor
            procs.append(
                h.popen(cmd, env=env, stdout=rank_log, stderr=subprocess.STDOUT, cwd=str(cwd))
            )
        state.add("pgids", procs[-1].pid)

    def sample() -> None:
        sent = [net_dev_tx_bytes(pid, iface) for pid, iface in ifaces]
        traffic.samples.append((time.monotonic(), sent))

    try:
        follow(mode, procs, logs, args.timeout, sample, every_line=args.script is not None)
    finally:
        traffic.seconds = time.monotonic() - start
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    return traffic


def follow(
    mode: str,
    procs: list[subprocess.Popen],
    logs: list[Path],
    timeout: float,
    sample: Callable[[], None] = lambda: None,
    every_line: bool = False,
) -> None:
    """Stream rank 0's step lines (`every_line`: all its lines, prefixed with the run) until
    every rank ended (or one failed, or `timeout` s passed: TimeoutError), calling `sample`
    on every poll; RuntimeError with the log tails of the ranks that failed."""
    deadline, shown = time.monotonic() + timeout, 0
    while True:
        sample()
        text = logs[0].read_text(errors="replace")
        for line in text[shown:].splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            shown += len(line)
            if every_line:
                print(f"[{mode:6}] {line}", end="", flush=True)
            elif line.startswith(("[switch]", "[gloo")):
                print(line, end="", flush=True)
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {mode} run did not finish within {timeout:.0f} s")
        time.sleep(0.2)
    bad = [i for i, p in enumerate(procs) if p.wait(30) != 0]
    if bad:
        texts = {i: logs[i].read_text(errors="replace") for i in bad}
        tails = "\n".join(f"--- rank {i} ({logs[i]}):\n{texts[i][-LOG_TAIL_CHARS:]}" for i in bad)
        message = f"the {mode} run failed on rank(s) {bad}:\n{tails}"
        signals = [_signal_name(int(n)) for t in texts.values() for n in _SIGNALLED.findall(t)]
        raise RankSignalled(message, signals) if signals else RuntimeError(message)


def _signal_name(number: int) -> str:
    """SIGSEGV for 11, and so on (the number where the system has no name for it)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_reference(
    mode: str, job: Callable[[int], Traffic], ports: tuple[int, int], out: Path
) -> Traffic:
    """A run beside the switch's (DDP over gloo, a peer method) on rendezvous port
    `ports[0]`, run once more on `ports[1]` when a rank was killed by a signal: torch's
    gloo crashes now and then without any homagg code in the process (docs/run.md). The
    crashed attempt's rank logs stay in `out` as <mode>-rank<i>-crashed.log. A second
    crash, or any other failure, is the run's error. The switch's own run is never
    repeated: its crashes are this project's to see."""
    try:
        return job(ports[0])
    except RankSignalled as exc:
        for log in out.glob(f"{mode}-rank*.log"):
            if not log.stem.endswith("-crashed"):
                log.rename(log.with_name(f"{log.stem}-crashed.log"))
        print(
            f"make run: a rank of the {mode} run was killed by {', '.join(exc.signals)} "
            f"(a crash inside torch, not homagg's: docs/run.md; its logs: "
            f"{mode}-rank*-crashed.log); running the {mode} run again",
            flush=True,
        )
        return job(ports[1])


def run_all(
    net: Mininet, args: argparse.Namespace, state: RunState, creds: RunCredentials
) -> tuple[str, dict[str, Traffic]]:
    """The switch run (then the switch's counters) and the gloo run and the peer runs, in
    that order or (--peers-first) the other way round; returns the counters and what each
    run sent."""
    others = ([] if args.no_gloo else ["gloo"]) + args.peer_list
    # a port each, and one more each for a run repeated after a crash
    ports = {
        mode: (SWITCH_RENDEZVOUS_PORT + 1 + i, SWITCH_RENDEZVOUS_PORT + 1 + len(others) + i)
        for i, mode in enumerate(others)
    }
    traffic: dict[str, Traffic] = {}
    if args.peers_first:
        for mode in others:
            job = partial(run_job, mode, net, args, state)
            traffic[mode] = run_reference(mode, job, ports[mode], args.out)
    # rank 0 creates the job
    traffic["switch"] = run_job("switch", net, args, state, SWITCH_RENDEZVOUS_PORT, creds)
    switch_counters = counters(state.names, creds, args.counters_timeout)
    if not args.peers_first:
        for mode in others:
            job = partial(run_job, mode, net, args, state)
            traffic[mode] = run_reference(mode, job, ports[mode], args.out)
    return switch_counters, traffic
