"""Trees of switches (two-level aggregation, docs/controller.md "Trees of switches"): which
leaves sit under which parent per the configuration, which world sizes a tree can hold, and
what a job spanning leaves needs on each switch. Pure functions over the configuration and
the job's ranks: the parent runs the job as an ordinary one-switch job whose members are the
leaves (one uplink rank each), each leaf runs it for its own workers plus an uplink entry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from homagg.api.errors import InvalidArgument
from homagg.control.aggregation import JobEntries, Uplink, Worker
from homagg.control.config import SwitchConfig
from homagg.control.delivery import mcast_grp_of_job
from homagg.control.forwarding import PeerService, Transit
from homagg.control.job_record import Job, JobWorker
from homagg.wire.constants import AGG_UDP_PORT, MAX_RANKS, MAX_WORKERS_PER_JOB

Configs = Mapping[str, SwitchConfig]


def leaves_of(configs: Configs, parent: str) -> list[SwitchConfig]:
    """The configured leaves of `parent`, in configuration order."""
    return [c for c in configs.values() if c.parent == parent]


def transit_hosts(configs: Configs, name: str) -> list[Transit]:
    """The hosts of the other switches of `name`'s tree, each with the port toward it: a leaf
    routes its parent's and its siblings' hosts up, a parent its leaves' hosts down."""
    me = configs[name]
    out: list[Transit] = []
    if me.parent:
        parent = configs[me.parent]
        others = [parent, *(c for c in leaves_of(configs, me.parent) if c.name != name)]
        out += [Transit(h, _port(me.parent_port), parent.mac) for o in others for h in o.hosts]
    for leaf in leaves_of(configs, name):
        out += [Transit(h, _port(leaf.port_on_parent), leaf.mac) for h in leaf.hosts]
    return out


def peer_services(configs: Configs, name: str) -> list[PeerService]:
    """The service addresses of the other switches of `name`'s tree, each with the port its
    frames arrive on: a leaf's parent and siblings via its parent_port, a parent's leaves each
    via its port_on_parent (the parent's results reach a leaf with the parent's address as
    source, a leaf's partials reach the parent with the leaf's)."""
    me = configs[name]
    out: list[PeerService] = []
    if me.parent:
        others = [configs[me.parent], *(c for c in leaves_of(configs, me.parent) if c.name != name)]
        out += [PeerService(o.service_ip, _port(me.parent_port)) for o in others]
    out += [
        PeerService(leaf.service_ip, _port(leaf.port_on_parent))
        for leaf in leaves_of(configs, name)
    ]
    return out


def tree_capacity(configs: Configs, parent: str) -> int:
    """The most ranks a job can have on the tree under `parent`: 32 per leaf (its seen
    bitmap), at most 32 leaves (the parent's), at most 256 ranks (the header's 8-bit rank)."""
    leaves = min(len(leaves_of(configs, parent)), MAX_WORKERS_PER_JOB)
    return min(leaves * MAX_WORKERS_PER_JOB, MAX_RANKS)


def check_world_fits(configs: Configs, world_size: int, switch: str = "") -> None:
    """InvalidArgument unless a job of `world_size` ranks can run: up to 32 on one switch,
    more only on a tree whose capacity holds it (under `switch` when one is named)."""
    if world_size <= MAX_WORKERS_PER_JOB:
        return
    parents = [switch] if switch else sorted({c.parent for c in configs.values() if c.parent})
    best = max((tree_capacity(configs, p) for p in parents), default=0)
    if best >= world_size:
        return
    where = f"switch {switch}" if switch else "the configured topology"
    has = (
        f"its largest tree holds {best}"
        if best
        else "it has no tree (no [[switch]] names a parent)"
    )
    raise InvalidArgument(
        f"world_size: {world_size} ranks need a tree of switches (one switch holds at most "
        f"{MAX_WORKERS_PER_JOB}; a tree 32 per leaf, up to 32 leaves, {MAX_RANKS} in all), and "
        f"{where} cannot hold them: {has}. Use at most {max(best, MAX_WORKERS_PER_JOB)} ranks, "
        "or configure leaves under a parent (docs/controller.md, Trees of switches)"
    )


def common_parent(configs: Configs, a: str, b: str) -> str:
    """The parent both switches are leaves of, or the parent when one is the other's ("" when
    they are in no tree together)."""
    pa, pb = configs[a].parent, configs[b].parent
    if pa and pa == pb:
        return pa
    if pa == b:
        return b
    if pb == a:
        return a
    return ""


def leaf_workers(job: Job) -> dict[str, list[JobWorker]]:
    """A tree job's joined ranks by their leaf, each list in rank order, the leaves in uplink
    order (by their lowest rank: rank 0's leaf has uplink rank 0)."""
    by_leaf: dict[str, list[JobWorker]] = {}
    for w in sorted(job.workers.values(), key=lambda w: w.rank):
        by_leaf.setdefault(w.switch, []).append(w)
    return by_leaf


def _worker(w: JobWorker) -> Worker:
    return Worker(rank=w.rank, switch_port=w.switch_port, mac=w.mac, ip=w.ip, udp_port=w.udp_port)


def tree_entries(
    job_id: int,
    pool_size: int,
    parent: SwitchConfig,
    pools: Mapping[str, int],
    leaves: Configs,
    workers: Mapping[str, Sequence[JobWorker]],
) -> dict[str, JobEntries]:
    """What each switch of a tree holds for a job, in write order (the parent, then the leaves
    in uplink order): `pools` is each switch's pool base, `workers` each leaf's ranks in
    uplink order. The parent's members are the leaves: rank = uplink rank, on port_on_parent,
    results rewritten to the leaf's service address; each leaf's workers get bits by their
    index there, and its uplink entry names its port, uplink rank and the parent."""
    up = list(workers)
    members = tuple(
        Worker(
            rank=rank,
            switch_port=_port(leaves[name].port_on_parent),
            mac=leaves[name].mac,
            ip=leaves[name].service_ip,
            udp_port=AGG_UDP_PORT,
        )
        for rank, name in enumerate(up)
    )
    group = mcast_grp_of_job(job_id)
    out = {parent.name: JobEntries(job_id, pools[parent.name], pool_size, group, members)}
    for rank, name in enumerate(up):
        uplink = Uplink(_port(leaves[name].parent_port), rank, parent.service_ip, parent.mac)
        ranks = tuple(_worker(w) for w in workers[name])
        out[name] = JobEntries(job_id, pools[name], pool_size, group, ranks, uplink)
    return out


def _port(port: int | None) -> int:
    if port is None:
        raise ValueError("a leaf without parent_port / port_on_parent")  # config.check_tree
    return port


def job_entries(job: Job, configs: Configs) -> dict[str, JobEntries]:
    """What each switch of the job holds for it, in write order (removal: reversed); a flat
    job's one switch, or a tree's parent and leaves. Only for a complete, placed job."""
    if not job.leaves:
        assert job.switch is not None
        return {job.switch: job.entries()}
    if not job.complete or job.switch is None or job.pool_base is None:
        raise ValueError(f"job {job.job_id} has no pool or missing ranks")
    workers = leaf_workers(job)
    if set(workers) != set(job.leaves):
        raise ValueError(
            f"job {job.job_id}: its ranks sit on {sorted(workers)}, its pools on "
            f"{sorted(job.leaves)}"
        )
    pools = {job.switch: job.pool_base, **job.leaves}
    return tree_entries(job.job_id, job.pool_size, configs[job.switch], pools, configs, workers)


def locate_workers(job: Job, configs: Configs) -> str:
    """Set each rank's switch (not persisted): a flat job's, or the leaf of a tree job whose
    hosts list the rank's IP. Returns what is wrong ("" when every rank has its switch)."""
    for w in job.workers.values():
        if not job.leaves:
            w.switch = job.switch or ""
            continue
        found = [n for n in job.leaves if n in configs and configs[n].host_by_ip(w.ip)]
        if len(found) != 1:
            return f"rank {w.rank} ({w.ip}) is a host of none of its leaves {sorted(job.leaves)}"
        w.switch = found[0]
    return ""


def tree_rows(job: Job) -> list[tuple[str, str, int, int, int]]:
    """A tree job's switches for operators: (switch, "parent" or "leaf", pool base, uplink
    rank, ranks there: a leaf's workers, the parent's leaves); none for a flat job."""
    if not job.leaves or job.switch is None or job.pool_base is None:
        return []
    by_leaf = leaf_workers(job)
    order = [n for n in by_leaf if n in job.leaves] + [n for n in job.leaves if n not in by_leaf]
    rows = [(job.switch, "parent", job.pool_base, 0, len(job.leaves))]
    rows += [
        (name, "leaf", job.leaves[name], rank, len(by_leaf.get(name, [])))
        for rank, name in enumerate(order)
    ]
    return rows
