"""The checks of the configured trees of switches (docs/controller.md, "Trees of switches"):
each leaf's parent configured, no cycle, two levels, the ports between them their own, each
host on one switch of a tree, and one kind of program on every switch of a tree."""

from __future__ import annotations

from homagg.control.config import ConfigError, SwitchConfig


def check_tree(switches: tuple[SwitchConfig, ...], where: str) -> None:
    """The leaves' parents: configured switches, no cycle, two levels (a parent is no leaf),
    distinct ports on each parent that are not its hosts', and the same cells per packet
    and lane ops on every switch of a tree."""
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
    """Leaf switches[i] under `parent`: the same kind of program on both, the parent's port
    toward it its own (no host's, no other leaf's), each host of the tree on one switch only."""
    sw = switches[i]
    _check_same_program(sw, parent, at)
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


def _program(sw: SwitchConfig) -> str:
    """What a switch's program makes of a packet: its cells and whether it adds lanes."""
    lanes = "adds" if sw.lane_ops else "drops"
    return f"{sw.cells_per_packet} cells a packet, {lanes} ADD16/ADD8"


def _check_same_program(sw: SwitchConfig, parent: SwitchConfig, at: str) -> None:
    """A leaf's partials are its workers' packets and its parent's results go to them: every
    switch of a tree must take the same packets (cells per packet, lane ops), so a tree mixes
    no Tofino switch (64 cells, no lanes) with a v1model one (docs/tofino.md)."""
    if (sw.cells_per_packet, sw.lane_ops) != (parent.cells_per_packet, parent.lane_ops):
        raise ConfigError(
            f"{at}: its program ({_program(sw)}) and its parent {parent.name}'s "
            f"({_program(parent)}) differ: a leaf's partials and its parent's results must "
            "pass both programs' checks, so every switch of a tree runs the same kind of "
            "program (the v1model one, or the Tofino one on every switch); fix parent, "
            "p4info or cells_per_packet"
        )
