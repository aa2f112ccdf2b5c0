"""Link shaping in the lab's namespaces: the htb token bucket that Mininet's TCLink puts on
both ends of a link for `bw` (`python -m run --bw`), so a namespace fabric shaped here
carries what a Mininet link of the same rate carries. `tc netem` rate does not hold here;
htb (and tbf) do (tests/packet/test_shaping.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from homagg.lab.namespace import tc

if TYPE_CHECKING:
    from homagg.lab.fabric import Fabric

HTB_HANDLE = "5:0"  # Mininet's TCIntf handles: root qdisc 5:0, its default class 5:1
HTB_CLASS = "5:1"
HTB_BURST = "15k"  # Mininet's burst for htb
QUEUE_HANDLE = "10:"  # the leaf queue under the class, when its length is given


def htb_commands(iface: str, mbit: float, queue: int = 0) -> list[list[str]]:
    """The tc commands (arguments after `tc`) that shape iface's egress to `mbit` Mbit/s
    as Mininet's TCLink(bw=mbit) does, on a link whose root qdisc was deleted first (htb
    cannot `change` an htb root in place); `queue` > 0: a drop-tail queue of that many
    packets under the class (as TCLink's max_queue_size; 0: htb's default leaf, the
    interface's txqueuelen, 1000 on a veth)."""
    if not mbit > 0:
        raise ValueError(f"a link rate must be positive Mbit/s, not {mbit!r}")
    if queue < 0:
        raise ValueError(f"a queue holds >= 0 packets (0: the default), not {queue!r}")
    leaf = ["qdisc", "add", "dev", iface, "parent", HTB_CLASS, "handle", QUEUE_HANDLE]
    return [
        ["qdisc", "add", "dev", iface, "root", "handle", HTB_HANDLE, "htb", "default", "1"],
        [
            "class", "add", "dev", iface, "parent", HTB_HANDLE, "classid", HTB_CLASS,
            "htb", "rate", f"{mbit:g}Mbit", "burst", HTB_BURST,
        ],
        *([[*leaf, "pfifo", "limit", str(queue)]] if queue else []),
    ]  # fmt: skip


def shape(netns: str, iface: str, mbit: float, queue: int = 0) -> None:
    """Shape iface's egress (in namespace netns) to `mbit` Mbit/s with a queue of `queue`
    packets (0: the default), replacing any shaping it had; 0 Mbit/s takes it off."""
    tc("qdisc", "del", "dev", iface, "root", netns=netns, check=False)  # none is fine
    if mbit == 0:
        return
    for cmd in htb_commands(iface, mbit, queue):
        tc(*cmd, netns=netns)


def shape_fabric(fabric: Fabric, mbit: float, queue: int = 0) -> None:
    """Shape both ends of every host link of a Fabric (the host's uplink and the switch's
    port toward it) to `mbit` Mbit/s, as Mininet shapes a link, with queues of `queue`
    packets (0: htb's default); 0 Mbit/s unshapes them."""
    for h in fabric.hosts:
        shape(h.namespace, h.iface, mbit, queue)
        shape(fabric.switch_namespace, h.switch_iface, mbit, queue)


def qdisc_drops(netns: str, iface: str) -> int:
    """Packets the qdiscs of iface's egress (in namespace netns) dropped since they were made
    (`tc -s qdisc`: htb's leaf queue overflowing when a burst outruns the rate)."""
    shown = tc("-s", "-j", "qdisc", "show", "dev", iface, netns=netns).stdout
    # the root's count holds its children's (htb's leaf queue): the root alone, not the sum
    return sum(int(q.get("drops", 0)) for q in json.loads(shown or "[]") if q.get("root"))


def fabric_drops(fabric: Fabric) -> int:
    """The qdisc drops of both ends of every host link of a Fabric (shape_fabric's queues;
    a re-shaped link starts again from 0, so take differences within one shaping)."""
    return sum(
        qdisc_drops(h.namespace, h.iface) + qdisc_drops(fabric.switch_namespace, h.switch_iface)
        for h in fabric.hosts
    )
