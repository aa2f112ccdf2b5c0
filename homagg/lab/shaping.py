"""Link shaping in the lab's namespaces: the htb token bucket that Mininet's TCLink puts on
both ends of a link for `bw` (`python -m run --bw`), so a namespace fabric shaped here
carries what a Mininet link of the same rate carries. `tc netem` rate does not hold here;
htb (and tbf) do (tests/packet/test_shaping.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homagg.lab.namespace import tc

if TYPE_CHECKING:
    from homagg.lab.fabric import Fabric

HTB_HANDLE = "5:0"  # Mininet's TCIntf handles: root qdisc 5:0, its default class 5:1
HTB_CLASS = "5:1"
HTB_BURST = "15k"  # Mininet's burst for htb


def htb_commands(iface: str, mbit: float) -> list[list[str]]:
    """The tc commands (arguments after `tc`) that shape iface's egress to `mbit` Mbit/s
    as Mininet's TCLink(bw=mbit) does, on a link whose root qdisc was deleted first (htb
    cannot `change` an htb root in place)."""
    if not mbit > 0:
        raise ValueError(f"a link rate must be positive Mbit/s, not {mbit!r}")
    return [
        ["qdisc", "add", "dev", iface, "root", "handle", HTB_HANDLE, "htb", "default", "1"],
        [
            "class", "add", "dev", iface, "parent", HTB_HANDLE, "classid", HTB_CLASS,
            "htb", "rate", f"{mbit:g}Mbit", "burst", HTB_BURST,
        ],
    ]  # fmt: skip


def shape(netns: str, iface: str, mbit: float) -> None:
    """Shape iface's egress (in namespace netns) to `mbit` Mbit/s, replacing any shaping it
    had; 0 takes the shaping off."""
    tc("qdisc", "del", "dev", iface, "root", netns=netns, check=False)  # none is fine
    if mbit == 0:
        return
    for cmd in htb_commands(iface, mbit):
        tc(*cmd, netns=netns)


def shape_fabric(fabric: Fabric, mbit: float) -> None:
    """Shape both ends of every host link of a Fabric (the host's uplink and the switch's
    port toward it) to `mbit` Mbit/s, as Mininet shapes a link; 0 unshapes them."""
    for h in fabric.hosts:
        shape(h.namespace, h.iface, mbit)
        shape(fabric.switch_namespace, h.switch_iface, mbit)
