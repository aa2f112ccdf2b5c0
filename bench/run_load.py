"""The machine's load while a Mininet run of the projection's check runs: a thread samples
/proc (the kernel's count of runnable threads, and each of the run's processes' CPU) and
writes one JSON line a sample; `phase_load` sums a phase of the run up (its switch
training, its gloo training). On a shared machine a process that is ready to run gets about
cores / runnable of a core, so the check predicts this machine's step with that share
(bench/projection_runs.py): a measurement of the machine, not of the step it predicts."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

AUTOGROUP = Path("/proc/self/autogroup")
INTERVAL = 0.25  # seconds between samples (a step of the runs takes 50-2000 ms)
SWITCH_COMMANDS = ("homagg.refswitch", "simple_switch")  # a switch process's command line
PHASE_MARK = {"switch": "--mode switch", "gloo": "--mode gloo"}  # the ranks' command lines


def runnable() -> int:
    """Threads running or ready to run, machine-wide (/proc/stat's procs_running), less
    the one reading it."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("procs_running"):
            return max(0, int(line.split()[1]) - 1)
    return 0


def runnable_groups() -> int:
    """Scheduling groups with a thread running or ready to run, machine-wide, less the
    reader's own: with sched_autogroup (the kernel's default on desktops and here) the
    kernel shares the CPU between sessions first, and Mininet starts each host's processes
    in a session of its own, so a ready rank or switch competes with each busy session as
    one, whatever its threads."""
    return len(ready_groups())


def ready_groups() -> dict[str, set[int]]:
    """The scheduling groups (autogroups) with a thread running or ready to run, each with
    its ready processes, the reader's own group left out."""
    me = Path("/proc/self/autogroup").read_text().split()[0] if AUTOGROUP.exists() else ""
    groups: dict[str, set[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ready = any(_state(t.path) == "R" for t in os.scandir(f"{entry.path}/task"))
            group = Path(entry.path, "autogroup").read_text().split() if ready else []
        except OSError:  # gone meanwhile, or no autogroups
            continue
        if group:  # empty while the process exits
            groups.setdefault(group[0], set()).add(int(entry.name))
    groups.pop(me, None)
    return groups


def _state(task: str) -> str:
    stat = Path(task, "stat").read_text()
    return stat[stat.rindex(")") + 2]


def switch_frames(pids: list[int]) -> tuple[int, int]:
    """Frames and bytes the switch processes `pids` have received so far on their ports:
    each switch runs in a network namespace of its own, whose interfaces its
    /proc/<pid>/net/dev lists (loopback left out; a namespace counted once, this one
    never). A frame that crosses two switches of a tree counts twice, as the model does."""
    frames = octets = 0
    seen = {os.stat("/proc/self/ns/net").st_ino}  # a wrapper's in this namespace: not a switch's
    for pid in pids:
        try:
            ns = os.stat(f"/proc/{pid}/ns/net").st_ino
            lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
        except OSError:  # gone meanwhile
            continue
        if ns in seen:
            continue
        seen.add(ns)
        for line in lines:
            name, counters = line.split(":", 1)
            if name.strip() != "lo":
                fields = counters.split()
                octets, frames = octets + int(fields[0]), frames + int(fields[1])
    return frames, octets


def processes() -> dict[int, tuple[int, float, str]]:
    """Every process: (parent pid, CPU seconds so far, command line)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        f = stat.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick, cmd[:300])
    return out


def descendants(procs: dict[int, tuple[int, float, str]], root: int) -> set[int]:
    """`root` and every process under it."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo += children.get(pid, [])
    return out


def steps_done(out: Path) -> dict[str, int]:
    """Steps each phase's rank 0 has printed so far (`python -m run` keeps its output in
    <out>/<mode>-rank0.log, a line a step, flushed)."""
    got = {}
    for phase in PHASE_MARK:
        try:
            got[phase] = Path(out, f"{phase}-rank0.log").read_text().count("] step ")
        except OSError:
            got[phase] = 0
    return got


class LoadSampler:
    """Samples the machine's runnable threads, the CPU of `root`'s process tree and the
    steps the run in `out` has done, every INTERVAL into `path` (JSON lines) until `stop`."""

    def __init__(self, path: Path, root: int, out: Path) -> None:
        self.path, self.root, self.out = path, root, out
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="run-load", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with open(self.path, "w") as out:
            while not self.done.is_set():
                self._sample(out)
                self.done.wait(INTERVAL)

    def _sample(self, out: IO[str]) -> None:
        procs = processes()
        mine = descendants(procs, self.root)
        ready = ready_groups()
        row = {
            "t": time.time(),
            "runnable": runnable(),
            "groups": len(ready),
            # of them, the run's own (its ranks and switches): the rest is the machine's load
            "own_groups": sum(1 for pids in ready.values() if pids & mine),
            "switch_frames": switch_frames(
                [p for p in mine if p in procs and _is_switch(procs[p][2])]
            ),
            "steps": steps_done(self.out),
            "procs": {str(p): [procs[p][1], procs[p][2]] for p in mine if p in procs},
        }
        out.write(json.dumps(row) + "\n")
        out.flush()

    def stop(self) -> None:
        """Stop sampling and close the file."""
        self.done.set()
        self.thread.join(timeout=5)


@dataclass(frozen=True)
class PhaseLoad:
    """A phase of a run: its wall seconds, the machine's mean runnable threads and ready
    scheduling groups (and how many of them were the run's own), the CPU seconds its switch
    processes and its ranks used, the frames its switches received."""

    seconds: float
    runnable: float  # threads
    groups: float  # scheduling groups with a ready thread, the run's own included
    switch_cpu_s: float
    ranks_cpu_s: float
    steps: int = 0  # steps the samples span
    own_groups: float | None = None  # of `groups`, the run's own (None: not sampled)
    switch_frames: int = 0  # frames the run's switches received (every crossing)
    switch_frame_bytes: int = 0

    @property
    def other_groups(self) -> float:
        """Ready groups that were not the run's: the machine's other load (all of them
        when the run's own were not told apart)."""
        return self.groups - (self.own_groups or 0.0)

    def share(self, cores: float) -> float:
        """The share of a core a ready process got while the run's processes worked side by
        side: cores / ready groups (the run's own included), at most 1. What a process
        that works while the others do gets (the switch step's CPU bounds)."""
        return share_of(cores, self.groups)

    def latency_share(self, cores: float) -> float:
        """The share of a core a process got when it ran alone in the run (a chain of
        hand-offs, as a small all-reduce's, where each process waits for the one before):
        cores / (the machine's other ready groups and itself). A record that did not tell
        the run's own groups apart gives the side-by-side share."""
        if self.own_groups is None:
            return self.share(cores)
        return share_of(cores, self.other_groups + 1)


def phase_load(lines: list[str], phase: str, skip: int) -> PhaseLoad | None:
    """The samples of a phase ('switch' or 'gloo') summed up, from the end of its step
    `skip` (its warm-up) to the end of its last; None when fewer than two samples fall there."""
    rows = [json.loads(line) for line in lines if line.strip()]
    done = [r["steps"][phase] for r in rows]
    if not done or max(done) <= skip:
        return None
    start = next(i for i, d in enumerate(done) if d >= skip)
    end = next(i for i, d in enumerate(done) if d == max(done))
    rows = rows[start : end + 1]
    if len(rows) < 2:
        return None
    first, last = rows[0]["procs"], rows[-1]["procs"]
    own = [r["own_groups"] for r in rows if "own_groups" in r]
    frames = [r["switch_frames"] for r in (rows[0], rows[-1]) if "switch_frames" in r]
    frames_delta = [b - a for a, b in zip(*frames)] if len(frames) == 2 else [0, 0]
    return PhaseLoad(
        seconds=rows[-1]["t"] - rows[0]["t"],
        runnable=statistics.mean(r["runnable"] for r in rows),
        groups=statistics.mean(r["groups"] for r in rows),
        switch_cpu_s=_cpu(first, last, _is_switch),
        ranks_cpu_s=_cpu(first, last, lambda c: PHASE_MARK[phase] in c),
        steps=done[end] - done[start],
        own_groups=statistics.mean(own) if len(own) == len(rows) else None,
        switch_frames=frames_delta[0],
        switch_frame_bytes=frames_delta[1],
    )


def _is_switch(cmd: str) -> bool:
    return any(s in cmd for s in SWITCH_COMMANDS)


def _cpu(first: dict[str, Any], last: dict[str, Any], match: Callable[[str], bool]) -> float:
    """CPU seconds the processes matching `match` used between two samples."""
    return sum(cpu - first[p][0] for p, (cpu, cmd) in last.items() if p in first and match(cmd))


class GroupSampler:
    """runnable_groups() every INTERVAL in a thread for a `with` block: the mean says what
    share of a core a ready process got meanwhile (the calibration's own load)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="groups", daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            self.samples.append(runnable_groups())
            self.done.wait(INTERVAL)

    def __enter__(self) -> GroupSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def mean(self) -> float:
        """Mean runnable scheduling groups over the samples (0 without any)."""
        return statistics.mean(self.samples) if self.samples else 0.0


def share_of(cores: float, groups: float) -> float:
    """The share of a core a ready process gets among `groups` ready scheduling groups."""
    return min(1.0, cores / groups) if groups > 0 else 1.0
