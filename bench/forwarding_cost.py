"""What forwarding an ordinary frame (not an aggregation packet) costs a switch target: its
process's CPU per frame and per byte, measured by routing UDP frames of two sizes from one
fabric host to another through it, and the latency of one frame crossing it when idle. In
Mininet, gloo's TCP frames and their ACKs cross the software switch this way, so the
projection's check against the runs charges them this (bench/projection_runs.py), not what
absorbing a contribution costs."""

from __future__ import annotations

import statistics
import struct
import time
from typing import Any

from bench import rawsend
from homagg.wire.frame import ipv4_checksum, mac_bytes

SIZES = (64, 1514)  # frame bytes: a bare ACK's order of size, and a full TCP segment's
FRAMES = 4096  # per size and repetition
WINDOW = 32  # frames in flight: the sender never outruns the switch by more
LATENCY_FRAMES = 200  # single frames timed one at a time through an idle switch
FORWARD_PORTS = (40900, 40901)  # UDP ports that are not the aggregation service's
ETH_IPV4 = 0x0800


def udp_frame(src: Any, dst: Any, switch_mac: str, size: int) -> bytes:
    """An Ethernet/IPv4/UDP frame of `size` bytes from fabric host `src` to host `dst`,
    addressed to the switch's MAC as a routed host's frames are (proxy ARP)."""
    payload = size - 14 - 20 - 8
    ip_len = 20 + 8 + payload

    def ipv4(checksum: int) -> bytes:
        return struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            ip_len,
            0,
            0x4000,
            64,
            17,
            checksum,
            bytes(int(x) for x in src.ip.split(".")),
            bytes(int(x) for x in dst.ip.split(".")),
        )

    eth = mac_bytes(switch_mac) + mac_bytes(src.mac) + struct.pack("!H", ETH_IPV4)
    udp = struct.pack("!HHHH", *FORWARD_PORTS, 8 + payload, 0)
    return eth + ipv4(ipv4_checksum(ipv4(0))) + udp + bytes(payload)


def _stream(fabric: Any, frame: bytes, pid: int) -> dict[str, float]:
    """Send FRAMES copies of `frame` from host 0 to host 1, WINDOW at a time: the switch
    process's CPU per frame, wall per frame, frames lost."""
    src, dst = fabric.hosts[0].raw, fabric.hosts[1].raw
    dst.drain()
    lost = 0
    cpu0, start = rawsend.process_cpu(pid), time.perf_counter()
    for _ in range(FRAMES // WINDOW):
        for _ in range(WINDOW):
            src.send(frame)
        lost += WINDOW - len(dst.receive(1.0, count=WINDOW))
    wall = time.perf_counter() - start
    cpu = rawsend.process_cpu(pid) - cpu0
    return {"cpu": cpu / FRAMES, "wall": wall / FRAMES, "lost": float(lost)}


def _crossing(fabric: Any, frame: bytes) -> float:
    """The median time one frame takes from host 0 to host 1 through the idle switch, sent
    one at a time: the switch's wake-up and its pipeline (BMv2's threads hand a frame on
    twice), what a small message of a peer algorithm pays per switch it crosses."""
    src, dst = fabric.hosts[0].raw, fabric.hosts[1].raw
    dst.drain()
    times = []
    for _ in range(LATENCY_FRAMES):
        start = time.perf_counter()
        src.send(frame)
        if dst.receive(1.0, count=1):
            times.append(time.perf_counter() - start)
        time.sleep(0.001)  # let the switch go idle again, as between a ring's steps
    if not times:
        raise RuntimeError("no frame crossed the switch: is it forwarding?")
    return statistics.median(times)


def forwarding_costs(target: str, reps: int) -> dict[str, float]:
    """The switch process's CPU per forwarded frame (a full 1514-byte one) and per byte
    beyond a 64-byte one, its wall time per frame at a window of WINDOW, medians over
    `reps` alternating the two sizes; frames lost in all; a small frame's crossing latency."""
    from homagg.lab.fabric import Fabric

    fabric = Fabric(target, 2)
    try:
        h0, h1 = fabric.hosts[0], fabric.hosts[1]
        frames = {s: udp_frame(h0, h1, fabric.switch_mac, s) for s in SIZES}
        pid = fabric.switch.proc.pid
        _stream(fabric, frames[SIZES[0]], pid)  # warm-up: tables, caches
        got: dict[int, list[dict[str, float]]] = {s: [] for s in SIZES}
        for _ in range(reps):
            for s in SIZES:
                got[s].append(_stream(fabric, frames[s], pid))
        crossing = _crossing(fabric, frames[SIZES[0]])
    finally:
        fabric.close()
    small, full = (
        {k: statistics.median(r[k] for r in got[s]) for k in ("cpu", "wall")} for s in SIZES
    )
    return {
        "forward_frame_s": full["cpu"],
        "forward_byte_s": max(0.0, full["cpu"] - small["cpu"]) / (SIZES[1] - SIZES[0]),
        "forward_small_s": small["cpu"],
        "forward_wall_s": full["wall"],
        "forward_lost": sum(r["lost"] for s in SIZES for r in got[s]),
        "forward_latency_s": crossing,
    }


def frame_cost(record: dict[str, Any], target: str, frame_bytes: float) -> float:
    """Seconds of the switch's work to forward one frame of `frame_bytes` on a calibrated
    target: the small frame's cost plus the per-byte cost of the rest (0: not calibrated,
    e.g. the eBPF program, whose cost is in the sending host's system time)."""
    t = record.get("forwarding", {}).get(target)
    if not t:
        return 0.0
    return float(t["forward_small_s"] + t["forward_byte_s"] * max(0.0, frame_bytes - SIZES[0]))


def forwarding_threads(record: dict[str, Any], target: str) -> float:
    """The cores a busy software switch spreads its work over: its CPU per full frame over
    its wall time per frame when streaming (BMv2 runs its pipeline in threads: more than
    one; the reference switch one); 1 when not calibrated."""
    t = record.get("forwarding", {}).get(target)
    if not t or t["forward_wall_s"] <= 0:
        return 1.0
    return max(1.0, float(t["forward_frame_s"] / t["forward_wall_s"]))


def crossing_latency(record: dict[str, Any], target: str) -> float:
    """Seconds a small frame takes to cross one idle switch of a calibrated target (0: not
    calibrated, or the eBPF program, which runs in the sender's own send)."""
    t = record.get("forwarding", {}).get(target)
    return float(t.get("forward_latency_s", 0.0)) if t else 0.0
