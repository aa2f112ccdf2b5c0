"""Where a job lives: the switch a worker is attached to (per the configured topology), the
job's pool on that switch within its job and worker table sizes, and the worker endpoints a
switch can tell apart. Pure functions over the manager's jobs and switches (its lock held)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from homagg.api.errors import AlreadyExists, FailedPrecondition, InvalidArgument, ResourceExhausted
from homagg.control.job_record import Job, JobWorker
from homagg.control.pools import PoolExhausted
from homagg.control.port_buffer import port_headroom, worker_switch
from homagg.control.switches import ManagedSwitch
from homagg.control.tree import Configs, common_parent
from homagg.p4rt.bytestrings import mac_to_int
from homagg.wire.constants import MAX_WORKERS_PER_JOB

log = logging.getLogger(__name__)


def attached_port(switches: Mapping[str, ManagedSwitch], ip: str) -> int:
    """The switch port a host is attached to, per the configured topology."""
    for sw in switches.values():
        host = sw.config.host_by_ip(ip)
        if host is not None:
            return host.switch_port
    raise InvalidArgument(
        f"{ip} is not a host of any configured switch, so its switch port is unknown: "
        "add the host to the controller's configuration or pass the switch port"
    )


def switch_of(switches: Mapping[str, ManagedSwitch], worker: JobWorker) -> ManagedSwitch | None:
    """The switch whose hosts list the worker's IP (None: no configured host); the MAC and port
    must match the topology."""
    for sw in switches.values():
        host = sw.config.host_by_ip(worker.ip)
        if host is None:
            continue
        if mac_to_int(host.mac) != mac_to_int(worker.mac) or host.switch_port != worker.switch_port:
            raise InvalidArgument(
                f"per the topology {worker.ip} is {host.mac} on port {host.switch_port} of "
                f"switch {sw.name}, not {worker.mac} on port {worker.switch_port}"
            )
        return sw
    return None


def switch_for(switches: Mapping[str, ManagedSwitch], job: Job, worker: JobWorker) -> ManagedSwitch:
    """The switch the worker is on: per the topology, else the job's (a flat job's only: a
    tree job takes only hosts the topology lists, it must know their leaf)."""
    sw = switch_of(switches, worker)
    if sw is not None:
        return sw
    if job.leaves:
        raise InvalidArgument(
            f"{worker.ip} is not a host of any configured switch: job {job.job_id} spans a "
            "tree of switches and takes only hosts its topology lists (their leaf)"
        )
    if job.switch is not None:
        return switches[job.switch]
    if len(switches) == 1:
        return next(iter(switches.values()))
    raise InvalidArgument(
        f"{worker.ip} is not a host of any configured switch, so the job's switch "
        f"cannot be chosen: name the switch in CreateJob"
    )


def check_endpoint_free(jobs: Iterable[Job], job: Job, worker: JobWorker, switch: str) -> None:
    """AlreadyExists when another rank of any running job on `switch` receives at the worker's
    (IP, UDP port): the switch sends both their results there, and the worker could not tell
    which rank's stream a result belongs to (a rank that left keeps its entries until its job
    ends, so it counts)."""
    endpoint = (worker.ip, worker.udp_port)
    for other in jobs:
        if switch not in other.switches and other is not job:
            continue
        clash = next(
            (
                w
                for w in other.workers.values()
                if (w.ip, w.udp_port) == endpoint
                and (other is job or worker_switch(other, w) == switch)
            ),
            None,
        )
        if clash is None:
            continue
        if other is job:
            raise AlreadyExists(
                f"rank {clash.rank} of job {job.job_id} already receives at "
                f"{worker.ip}:{worker.udp_port}"
            )
        raise AlreadyExists(
            f"{worker.ip}:{worker.udp_port} is already used by rank {clash.rank} of job "
            f"{other.job_id} ({other.name}) on switch {switch}: the switch could not tell "
            "their results apart; bind another UDP port and join with it"
        )


def members_on(job: Job) -> int:
    """Worker entries the job may take on each of its switches: its world, at most 32 (a
    tree's leaf holds its own workers, its parent the leaves, 32 of either at most)."""
    return min(job.world_size, MAX_WORKERS_PER_JOB)


def check_room(jobs: Iterable[Job], job: Job, sw: ManagedSwitch) -> None:
    """ResourceExhausted unless the switch's job and worker tables have room for the job."""
    there = [j for j in jobs if sw.name in j.switches and j is not job]
    if len(there) >= sw.max_jobs:
        raise ResourceExhausted(
            f"switch {sw.name} already runs {len(there)} jobs, all its job table holds"
        )
    ranks = sum(members_on(j) for j in there)
    if ranks + members_on(job) > sw.max_workers:
        raise ResourceExhausted(
            f"switch {sw.name} has room for {sw.max_workers - ranks} more ranks, "
            f"the job needs {members_on(job)}"
        )


def place(jobs: Iterable[Job], job: Job, sw: ManagedSwitch) -> None:
    """Allocate the job's pool on the switch (within its job and worker table sizes), of at
    most the switch's `max_pool_size` slots: a rank has a pool's worth of chunks in flight,
    which reach its switch port back to back, and a target buffers only so many frames per
    port (BMv2 about 1,300: docs/bmv2.md). A larger request gets that many slots."""
    check_room(jobs, job, sw)
    size = min(job.pool_size, sw.config.max_pool_size)
    try:
        job.pool_base = sw.pools.allocate(size)
    except PoolExhausted as exc:
        raise PoolExhausted(f"switch {sw.name}: {exc}") from None
    if size < job.pool_size:
        log.info(
            "job %d asked for a pool of %d; switch %s takes at most %d chunks in flight per "
            "rank (max_pool_size)",
            job.job_id,
            job.pool_size,
            sw.name,
            size,
        )
    job.pool_size, job.switch = size, sw.name


def fit_port(
    switches: Mapping[str, ManagedSwitch], jobs: Iterable[Job], job: Job, worker: JobWorker
) -> int | None:
    """Make room for the rank's pool in its port's buffer (`port_buffer`), which every job with
    a rank on that port shares. The job's first rank may shrink the pool to the headroom (no
    rank holds an assignment yet: the pool is granted, as `max_pool_size` caps it; a tree
    job's pools on every switch alike); a later rank's pool is fixed, and ResourceExhausted
    names the port and its headroom. Returns the size before a shrink (for `unfit_port`)."""
    sw = switches[worker.switch]
    configs = {n: s.config for n, s in switches.items()}
    room = port_headroom(jobs, sw.name, worker.switch_port, sw.config.port_buffer, configs)
    if room >= job.pool_size:
        return None
    if job.workers or room < 1:
        raise ResourceExhausted(
            f"switch {sw.name} port {worker.switch_port} (rank {worker.rank}'s) has room for "
            f"{room} more slots in flight of its port_buffer {sw.config.port_buffer}, "
            f"shared by the jobs with ranks there; job {job.job_id}'s pool is {job.pool_size}: "
            "wait for a job on that port to end, or create the job with a smaller pool_size"
        )
    old = job.pool_size
    _resize(switches, job, room)
    log.info(
        "job %d: pool %d shrunk to %d, the headroom of switch %s port %d (port_buffer %d)",
        job.job_id,
        old,
        room,
        sw.name,
        worker.switch_port,
        sw.config.port_buffer,
    )
    return old


def _resize(switches: Mapping[str, ManagedSwitch], job: Job, size: int) -> None:
    """Give each of the job's pools `size` slots at its base (shrinking: the head of its own
    range is always free; growing back: what it gave up is still free under the lock)."""
    for name, base in job.pools.items():
        switches[name].pools.release(base)
        switches[name].pools.reserve(base, size)
    job.pool_size = size


def unfit_port(switches: Mapping[str, ManagedSwitch], job: Job, old: int | None) -> None:
    """Undo `fit_port`'s shrink (the join failed after it)."""
    if old is not None:
        _resize(switches, job, old)


class _Undo:
    """What a join changed in the placement, to put back if the join fails after."""

    def __init__(self, switches: Mapping[str, ManagedSwitch], job: Job) -> None:
        self.switches, self.job = switches, job
        self.fields = (job.switch, job.pool_base, dict(job.leaves), job.pool_size)
        self.taken: list[tuple[str, int]] = []  # pools allocated by the join
        self.freed: list[tuple[str, int, int]] = []  # pools released by it (base, size)

    def allocate(self, name: str, jobs: Iterable[Job]) -> int:
        """A pool of the job's size on switch `name` (its tables with room for the job)."""
        sw = self.switches[name]
        check_room(jobs, self.job, sw)
        if self.job.pool_size > sw.config.max_pool_size:
            raise ResourceExhausted(
                f"switch {name} takes pools of at most {sw.config.max_pool_size} slots "
                f"(max_pool_size), job {self.job.job_id}'s is {self.job.pool_size} on every "
                "switch of its tree: create it with a smaller pool_size"
            )
        try:
            base = sw.pools.allocate(self.job.pool_size)
        except PoolExhausted as exc:
            raise PoolExhausted(f"switch {name}: {exc}") from None
        self.taken.append((name, base))
        return base

    def release(self, name: str, base: int) -> None:
        self.freed.append((name, base, self.switches[name].pools.release(base)))

    def __call__(self) -> None:
        for name, base in reversed(self.taken):
            self.switches[name].pools.release(base)
        for name, base, size in self.freed:
            self.switches[name].pools.reserve(base, size)
        job = self.job
        job.switch, job.pool_base, job.leaves, job.pool_size = self.fields
        job.leaves = dict(job.leaves)


def _grow(configs: Configs, jobs: list[Job], job: Job, worker: JobWorker, undo: _Undo) -> None:
    """Put the job on the tree that the joining rank's switch (`leaf`) shares with the job's
    switches: a flat job on a sibling leaf becomes a tree under their parent, a job on the
    parent (named at creation) or already a tree gains the leaf. FailedPrecondition when
    there is no such tree."""
    assert job.switch is not None and job.pool_base is not None
    leaf = worker.switch
    parent = job.switch if job.leaves else common_parent(configs, job.switch, leaf)
    if leaf == parent:
        raise FailedPrecondition(
            f"rank {worker.rank} of job {job.job_id} is attached to switch {leaf}, the "
            f"parent of the job's leaves: a tree job's ranks sit on its leaves only"
        )
    if not parent or configs[leaf].parent != parent:
        raise FailedPrecondition(
            f"job {job.job_id} runs on switch {job.switch} but rank {worker.rank} is "
            f"attached to {leaf}, and they are not leaves of one parent: a job spans several "
            "switches only as leaves of one parent (docs/controller.md, Trees of switches)"
        )
    if any(w.switch == parent for w in job.workers.values()):
        raise FailedPrecondition(
            f"job {job.job_id} has ranks on switch {parent} itself, which is the parent of "
            f"{leaf}: a tree job's ranks sit on its leaves only"
        )
    if len(job.leaves) >= MAX_WORKERS_PER_JOB:
        raise ResourceExhausted(
            f"job {job.job_id} already spans {MAX_WORKERS_PER_JOB} leaves, all a parent holds"
        )
    new = [leaf] if job.leaves or job.switch == parent else [job.switch, leaf]
    _check_uplinks(configs, [j for j in jobs if j is not job], job, parent, new)
    if not job.leaves and job.switch != parent:  # flat on a sibling leaf: the parent above
        job.leaves = {job.switch: job.pool_base}
        job.pool_base, job.switch = undo.allocate(parent, jobs), parent
    job.leaves[leaf] = undo.allocate(leaf, jobs)


def _check_uplinks(
    configs: Configs, others: list[Job], job: Job, parent: str, leaves: list[str]
) -> None:
    """ResourceExhausted unless each new leaf's uplink port and the parent's port toward it
    have room for the job's pool in their port_buffer (the other jobs' uplinks and ranks
    there take theirs)."""
    for leaf in leaves:
        c = configs[leaf]
        assert c.parent_port is not None and c.port_on_parent is not None
        for name, port in ((leaf, c.parent_port), (parent, c.port_on_parent)):
            buffer = configs[name].port_buffer
            room = port_headroom(others, name, port, buffer, configs)
            if room < job.pool_size:
                raise ResourceExhausted(
                    f"switch {name} port {port} (the uplink between {leaf} and {parent}) has "
                    f"room for {room} more slots in flight of its port_buffer {buffer}; job "
                    f"{job.job_id}'s pool is {job.pool_size}: wait for a job across that "
                    "uplink to end, or create the job with a smaller pool_size"
                )


def _complete_tree(job: Job, undo: _Undo) -> None:
    """When the job's last rank joins: leaves whose ranks all left give their pools back, and
    a tree whose ranks sit on one leaf runs flat on it (no parent entries)."""
    ranks_on = {w.switch for w in job.workers.values()}
    for name, base in list(job.leaves.items()):
        if name not in ranks_on:
            undo.release(name, base)
            del job.leaves[name]
    if len(job.leaves) == 1:
        assert job.switch is not None and job.pool_base is not None
        undo.release(job.switch, job.pool_base)
        (job.switch, job.pool_base), job.leaves = next(iter(job.leaves.items())), {}


def admit(
    switches: Mapping[str, ManagedSwitch], jobs: Iterable[Job], job: Job, worker: JobWorker
) -> Callable[[], None]:
    """Make room for a joining rank on its switch: its endpoint free there, the job's pool
    placed with its first rank (when its switch was not known at creation), on a tree of
    switches when the rank's leaf is another than the job's, and within the rank's port
    buffer (`fit_port`). Sets the rank's switch. Returns what undoes it, for a join that
    fails after (the rank not yet in job.workers)."""
    jobs = list(jobs)
    sw = switch_for(switches, job, worker)
    worker.switch = sw.name
    check_endpoint_free(jobs, job, worker, sw.name)
    on_leaf = sum(1 for w in job.workers.values() if w.switch == sw.name)
    if on_leaf >= MAX_WORKERS_PER_JOB:
        raise ResourceExhausted(
            f"job {job.job_id} has {on_leaf} ranks on switch {sw.name}, all one switch holds "
            f"of a job: place its other ranks on other leaves of the tree"
        )
    undo = _Undo(switches, job)
    try:
        if job.switch is None:
            place(jobs, job, sw)
            undo.taken.append((sw.name, job.pool_base))  # type: ignore[arg-type]
        elif sw.name not in job.switches or (job.leaves and sw.name == job.switch):
            configs = {n: s.config for n, s in switches.items()}
            _grow(configs, jobs, job, worker, undo)
        if len(job.workers) + 1 == job.world_size and job.leaves:
            job.workers[worker.rank] = worker
            try:
                _complete_tree(job, undo)
            finally:
                del job.workers[worker.rank]
        shrunk = fit_port(switches, jobs, job, worker)
    except BaseException:
        undo()
        raise

    def undo_all() -> None:
        unfit_port(switches, job, shrunk)
        undo()

    return undo_all


def unplace(switches: Mapping[str, ManagedSwitch], job: Job) -> None:
    """Give the job's pools back (a creation or first join that failed)."""
    for name, base in job.pools.items():
        switches[name].pools.release(base)
    job.switch = job.pool_base = None
    job.leaves = {}
