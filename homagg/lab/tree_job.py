"""A two-level job installed on a tree fabric, the way docs/protocol.md ("Two-level
aggregation") lays it out: the parent runs an ordinary job whose ranks are the leaves
(uplink rank u = the leaf's index among the job's leaves), each leaf runs the job for its
own hosts with an uplink entry toward the parent. Ranks are numbered leaf by leaf."""

from __future__ import annotations

from collections.abc import Sequence

from homagg.control.aggregation import JobEntries, Uplink, Worker
from homagg.control.delivery import mcast_grp_of_job
from homagg.control.install import install_job
from homagg.lab.aggjob import RankTraffic, next_job_id, pool_base_of
from homagg.lab.fabric import Fabric, FabricHost
from homagg.lab.tree_fabric import UPLINK_PORT, TreeFabric, TreeLeaf
from homagg.wire.constants import AGG_UDP_PORT, WORKER_UDP_BASE
from homagg.wire.frame import FrameTemplate

# The parent's pool starts this many slots after the leaves' (each switch has its own
# pool_base; the header's slot is relative to the pool on every switch). Pools up to this
# size stay within the job's POOL_STRIDE of homagg/lab/aggjob.py.
PARENT_POOL_OFFSET = 32


class TreeJob(RankTraffic):
    """A job over the first hosts_per_leaf[k] hosts of leaf k (leaves with none are not
    in the job); installs the parent's entries, then per leaf its uplink entry and its
    job's entries, so that no partial ever reaches a switch not ready for it."""

    def __init__(
        self, tree: TreeFabric, hosts_per_leaf: Sequence[int], pool_size: int = 16
    ) -> None:
        if len(hosts_per_leaf) > len(tree.leaves):
            raise ValueError(f"{len(hosts_per_leaf)} leaves asked, the tree has {len(tree.leaves)}")
        self.tree = tree
        self.pool_size = pool_size
        self.job_id = next_job_id()
        self.leaves: list[TreeLeaf] = [tree.leaves[k] for k, n in enumerate(hosts_per_leaf) if n]
        self.hosts: list[FabricHost] = []
        self._fabrics: list[Fabric] = []  # per rank
        for k, n in enumerate(hosts_per_leaf):
            self.hosts += tree.leaves[k].hosts[:n]
            self._fabrics += [tree.leaves[k].fabric] * n
        base, group = pool_base_of(self.job_id), mcast_grp_of_job(self.job_id)
        self.parent_entries = JobEntries(
            self.job_id, base + PARENT_POOL_OFFSET, pool_size, group, self._leaf_workers()
        )
        parent = tree.parent
        self.leaf_entries = [
            JobEntries(
                self.job_id,
                base,
                pool_size,
                group,
                self._workers_of(leaf),
                Uplink(UPLINK_PORT, u, parent.service_ip, parent.switch_mac),
            )
            for u, leaf in enumerate(self.leaves)
        ]
        self.templates = [
            FrameTemplate(h.mac, f.switch_mac, h.ip, f.service_ip, WORKER_UDP_BASE + r)
            for r, (h, f) in enumerate(zip(self.hosts, self._fabrics, strict=True))
        ]
        self._install()

    def _leaf_workers(self) -> tuple[Worker, ...]:
        """The parent's ranks: one per leaf, its results to the leaf's service address."""
        return tuple(
            Worker(
                u, leaf.parent_port, leaf.fabric.switch_mac, leaf.fabric.service_ip, AGG_UDP_PORT
            )
            for u, leaf in enumerate(self.leaves)
        )

    def _workers_of(self, leaf: TreeLeaf) -> tuple[Worker, ...]:
        return tuple(
            Worker(r, h.switch_port, h.mac, h.ip, WORKER_UDP_BASE + r)
            for r, h in enumerate(self.hosts)
            if self._fabrics[r] is leaf.fabric
        )

    def _install(self) -> None:
        """The parent first, then each leaf (install_job writes its uplink entry first)."""
        install_job(self.tree.parent.conn, self.parent_entries)
        for leaf, entries in zip(self.leaves, self.leaf_entries, strict=True):
            install_job(leaf.fabric.conn, entries)

    def fabric_of(self, rank: int) -> Fabric:
        """The leaf switch rank `rank` sends to."""
        return self._fabrics[rank]

    def uplink_rank(self, leaf: TreeLeaf) -> int:
        """The leaf's rank in the parent's job."""
        return self.leaves.index(leaf)

    def ranks_of(self, leaf: TreeLeaf) -> list[int]:
        """The job's ranks on a leaf."""
        return [r for r, f in enumerate(self._fabrics) if f is leaf.fabric]
