"""The checks of the configured trees of switches (docs/controller.md, "Trees of switches"):
each leaf's parent configured, no cycle, two levels, the ports between them their own, each
host on one switch of a tree, and the v1model program on every switch of a tree."""

from __future__ import annotations

from homagg.control.config import ConfigError, SwitchConfig


def check_tree(switches: tuple[SwitchConfig, ...], where: str) -> None:
    """The leaves' parents: configured switches, no cycle, two levels (a parent is no leaf),
    distinct ports on each parent that are not its hosts', and the v1model program on every
    switch of a tree (the TNA program has no uplink table: docs/tofino.md)."""
    by_name = {s.name: s for s in switches}
    for i, sw in enumerate(switches):
        if not sw.parent:
            continue
        at = f"{where}: switch[{i}] ({sw.name})"
        parent = by_name.get(sw.parent)
        if parent is None:
            raise ConfigError(
                f"{at}.parent: no switch {sw.parent!r} is configured (configured: "
                f"{', '.join(by_name)}): add its [[switch]] or fix the name"
            )
        if parent.name == sw.name or parent.parent == sw.name:
            raise ConfigError(f"{at}.parent: {sw.parent!r} makes a cycle of parents")
        if parent.parent:
            raise ConfigError(
                f"{at}.parent: {parent.name} is itself a leaf (of {parent.parent}); the "
                "controller places jobs on trees of two levels: a leaf's parent has no parent"
            )
        _check_leaf(switches, i, parent, at)


def _check_leaf(switches: tuple[SwitchConfig, ...], i: int, parent: SwitchConfig, at: str) -> None:
    """Leaf switches[i] under `parent`: the v1model program on both, the parent's port toward
    it its own (no host's, no other leaf's), each host of the tree on one switch only."""
    sw = switches[i]
    for s in (sw, parent):
        if s.p4info is not None:
            raise ConfigError(
                f"{at}: switch {s.name} runs its own program (p4info), and the Tofino "
                "program has no uplink table (docs/tofino.md): a tree needs the v1model "
                "program on every switch; remove parent or p4info"
            )
    if any(h.switch_port == sw.port_on_parent for h in parent.hosts):
        raise ConfigError(
            f"{at}.port_on_parent: port {sw.port_on_parent} of {parent.name} is a host's port"
        )
    ips = [
        h.ip for s in (parent, *(s for s in switches if s.parent == parent.name)) for h in s.hosts
    ]
    dup = next((ip for ip in ips if ips.count(ip) > 1), None)
    if dup is not None:
        raise ConfigError(
            f"{at}: host {dup} is listed on two switches of {parent.name}'s tree: the "
            "switches route each host's address toward its own switch"
        )
    twin = next(
        (
            s
            for s in switches[:i]
            if s.parent == sw.parent and s.port_on_parent == sw.port_on_parent
        ),
        None,
    )
    if twin is not None:
        raise ConfigError(
            f"{at}.port_on_parent: port {sw.port_on_parent} of {parent.name} is also "
            f"{twin.name}'s: each leaf needs its own port on the parent"
        )
