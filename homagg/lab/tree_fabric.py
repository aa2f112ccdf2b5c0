"""A tree of switches for two-level aggregation (docs/protocol.md, "Two-level aggregation"):
leaf switches with hosts, one parent switch above them and a link between each leaf's
uplink port and a port of the parent, every switch of one target kind. Each switch is a
Fabric (homagg/lab/fabric.py) with a subnet of its own; the links carry a tag of ours, so
close() and `make stop` (homagg/lab/cleanup.py) find everything the tree made."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from homagg.control.forwarding import PeerService
from homagg.lab.addresses import service_ip
from homagg.lab.fabric import Fabric, FabricHost, new_fabric_tag
from homagg.lab.namespace import delete_link, in_namespace, ip, tc
from homagg.lab.rawsock import RawPort
from homagg.lab.switch_process import BMV2_TARGETS
from homagg.lab.threads import run_threads

UPLINK_PORT = 100  # every leaf's port toward the parent (its hosts are on ports 1..n)
PARENT_SUBNET = 0  # the parent's service address is 10.0.0.254; leaf k's subnet is k + 1
BUILD_TIMEOUT = 120.0  # seconds for every switch to start and take its pipeline


def parent_port_of(leaf: int) -> int:
    """The parent's port toward leaf `leaf` (0-based)."""
    return leaf + 1


@dataclass
class TreeLeaf:
    """A leaf switch with its hosts, and its link to the parent."""

    index: int
    fabric: Fabric
    link: str  # the leaf's end of the link, on its UPLINK_PORT (in the leaf's namespace)
    parent_link: str  # the parent's end, on parent_port (in the parent's namespace)
    _tap: RawPort | None = field(default=None, repr=False)

    @property
    def parent_port(self) -> int:
        """The parent's port toward this leaf."""
        return parent_port_of(self.index)

    @property
    def hosts(self) -> list[FabricHost]:
        return self.fabric.hosts

    @property
    def tap(self) -> RawPort:
        """A raw socket on the parent's end of the link: it receives what the leaf sends up
        (the parent switch receives it too) and sends frames the leaf takes in on its
        uplink port as if the parent had sent them (TreeFabric.tap_echo: whether the parent
        switch takes them in as well)."""
        if self._tap is None:
            raise RuntimeError(f"leaf {self.index} has no tap: the tree is not built")
        return self._tap


class TreeFabric:
    """`num_leaves` leaves with `hosts_per_leaf` hosts each under one parent switch, all of
    kind `target`; leaf k's hosts and service address are in subnet k + 1 and its switch
    MAC is switch_mac(k + 1), the parent's are subnet PARENT_SUBNET's. Only forwarding
    entries are installed: jobs are set up by homagg/lab/tree_job.py."""

    def __init__(
        self,
        target: str,
        num_leaves: int = 2,
        hosts_per_leaf: int = 2,
        workdir: Path | None = None,
    ) -> None:
        self.target = target
        # BMv2 captures every frame on its ports, those another socket sends out of them too:
        # the parent then takes in what a tap sends toward a leaf (and drops it: no route).
        self.tap_echo = target in BMV2_TARGETS
        self.tag = new_fabric_tag()  # the links' names; each switch has its own fabric tag
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.leaves: list[TreeLeaf] = []
        self._parent: Fabric | None = None
        self._links = [(f"{self.tag}u{k}", f"{self.tag}p{k}") for k in range(num_leaves)]
        try:
            self._build(hosts_per_leaf)
        except BaseException:
            self.close()
            raise

    def _build(self, hosts_per_leaf: int) -> None:
        for link, parent_link in self._links:
            # Made here, moved into the switches' namespaces by their fabrics (down until then).
            ip("link", "add", link, "type", "veth", "peer", "name", parent_link)
        parent_links = {parent_port_of(k): p for k, (_, p) in enumerate(self._links)}
        leaf_ips = [service_ip(PARENT_SUBNET + 1 + k) for k in range(len(self._links))]
        up = [service_ip(PARENT_SUBNET), *leaf_ips]  # every service address a leaf sees come up
        work: list[Callable[[], Fabric]] = [
            partial(
                Fabric,
                self.target,
                0,
                self._subdir("parent"),
                subnet=PARENT_SUBNET,
                links=parent_links,
                peers=tuple(PeerService(a, parent_port_of(k)) for k, a in enumerate(leaf_ips)),
            )
        ]
        work += [
            partial(
                Fabric,
                self.target,
                hosts_per_leaf,
                self._subdir(f"leaf{k}"),
                subnet=PARENT_SUBNET + 1 + k,
                links={UPLINK_PORT: link},
                peers=tuple(PeerService(a, UPLINK_PORT) for a in up if a != leaf_ips[k]),
            )
            for k, (link, _) in enumerate(self._links)
        ]
        # The switches start side by side (each waits for its process and its pipeline).
        _, built = run_threads(work, BUILD_TIMEOUT, return_errors=True)
        if isinstance(built[0], Fabric):
            self._parent = built[0]
        for k, fabric in enumerate(built[1:]):
            if isinstance(fabric, Fabric):
                self.leaves.append(TreeLeaf(k, fabric, *self._links[k]))
        failed = [b for b in built if isinstance(b, BaseException)]
        if failed:
            raise failed[0]
        with in_namespace(self.parent.switch_namespace):
            for leaf in self.leaves:
                leaf._tap = RawPort(leaf.parent_link)

    def _subdir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def parent(self) -> Fabric:
        """The parent switch's fabric (no hosts; its ports lead to the leaves)."""
        if self._parent is None:
            raise RuntimeError("tree fabric has no parent switch: it failed to build or is closed")
        return self._parent

    def switches(self) -> list[Fabric]:
        """The parent, then the leaves."""
        return [self.parent, *(leaf.fabric for leaf in self.leaves)]

    @contextmanager
    def cut_up(self, leaf: int) -> Iterator[None]:
        """Frames leaf `leaf` sends toward the parent are lost while the body runs."""
        with _lossy(self.leaves[leaf].link, self.leaves[leaf].fabric.switch_namespace):
            yield

    @contextmanager
    def cut_down(self, leaf: int) -> Iterator[None]:
        """Frames the parent sends toward leaf `leaf` are lost while the body runs."""
        with _lossy(self.leaves[leaf].parent_link, self.parent.switch_namespace):
            yield

    def drain(self) -> None:
        """Discard frames queued at every host and tap."""
        for leaf in self.leaves:
            leaf.fabric.drain()
            if leaf._tap is not None:
                leaf._tap.drain()

    def close(self) -> None:
        """Stop every switch and remove every namespace and link the tree made."""
        for leaf in self.leaves:
            if leaf._tap is not None:
                leaf._tap.close()
                leaf._tap = None
        fabrics = [leaf.fabric for leaf in self.leaves]
        fabrics += [self._parent] if self._parent is not None else []
        self.leaves, self._parent = [], None
        # Side by side, as they were built; each close() stops its switch within its bound.
        work: list[Callable[[], object]] = [f.close for f in fabrics]
        _, closed = run_threads(work, BUILD_TIMEOUT, return_errors=True)
        for link, _ in self._links:  # a link no fabric took is still here
            delete_link(link)
        failed = [c for c in closed if isinstance(c, BaseException)]
        if failed:
            raise failed[0]

    def __enter__(self) -> TreeFabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def _lossy(iface: str, netns: str) -> Iterator[None]:
    """Every frame sent out of `iface` is dropped while the body runs: a FIFO queue of
    length 0 (the switch sees its send fail or succeed; the frame is lost either way)."""
    tc("qdisc", "replace", "dev", iface, "root", "pfifo", "limit", "0", netns=netns)
    try:
        yield
    finally:
        tc("qdisc", "del", "dev", iface, "root", netns=netns, check=False)
