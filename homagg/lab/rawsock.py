"""Raw Ethernet sockets and NIC offload settings, for switch ports and test hosts."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import select
import socket
import struct
import sys
import time

from homagg.wire.frame import MAX_DATAGRAM_BYTES

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SIOCETHTOOL = 0x8946
# ethtool "set" commands for checksum and segmentation offloads (linux/ethtool.h)
ETHTOOL_STXCSUM = 0x17
ETHTOOL_SSG = 0x19
ETHTOOL_STSO = 0x1F
ETHTOOL_SGSO = 0x24
ETHTOOL_SGRO = 0x2C
# ... and the "get" commands libpcap reads to size its capture ring (pcap-linux.c)
ETHTOOL_GTSO = 0x1E
ETHTOOL_GUFO = 0x21
ETHTOOL_GGSO = 0x23
ETHTOOL_GFLAGS = 0x25
ETHTOOL_GGRO = 0x2B
ETH_FLAG_LRO = 1 << 15


def disable_offloads(iface: str) -> None:
    """Turn off tx checksum and segmentation offloads, as Mininet's P4 hosts do.

    On veth, offloaded packets reach a raw-socket switch with partial checksums or as
    one oversized segment; a software switch must see the frames a wire would carry.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for cmd in (ETHTOOL_STXCSUM, ETHTOOL_SSG, ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SGRO):
            value = ctypes.create_string_buffer(struct.pack("II", cmd, 0))
            ifreq = struct.pack("16sP", iface.encode(), ctypes.addressof(value))
            # OSError: the driver lacks this offload, so there is nothing to turn off.
            with contextlib.suppress(OSError):
                fcntl.ioctl(sock, SIOCETHTOOL, ifreq)


def _ethtool_get(sock: socket.socket, iface: str, cmd: int) -> int:
    value = ctypes.create_string_buffer(struct.pack("II", cmd, 0))
    ifreq = struct.pack("16sP", iface.encode(), ctypes.addressof(value))
    try:
        fcntl.ioctl(sock, SIOCETHTOOL, ifreq)
    except OSError:
        return 0  # the driver lacks this offload: it cannot be on
    return struct.unpack("II", value.raw[:8])[1]


def offloads_on(iface: str) -> list[str]:
    """The segmentation/receive offloads still on at iface, as libpcap checks them: with any
    of them on, libpcap sizes each frame of its capture ring for a 64 KiB packet."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        on = [
            name
            for name, cmd in (
                ("tso", ETHTOOL_GTSO),
                ("ufo", ETHTOOL_GUFO),
                ("gso", ETHTOOL_GGSO),
                ("gro", ETHTOOL_GGRO),
            )
            if _ethtool_get(sock, iface, cmd)
        ]
        if _ethtool_get(sock, iface, ETHTOOL_GFLAGS) & ETH_FLAG_LRO:
            on.append("lro")
    return on


def turn_offloads_off(ifaces: list[str]) -> None:
    """Turn segmentation and receive offloads off on a switch's ports before the switch
    opens them; RuntimeError naming the port if one stays on.

    BMv2 captures each port with libpcap in immediate mode, whose ring (2 MiB, BMv2 sets no
    size) is cut into frames sized for the largest packet the interface can hand it: MTU +
    18 bytes with offloads off (about 1,300 frames), 64 KiB with TSO/GSO/GRO on (31 frames).
    A veth has TSO and GSO on by default, so a burst of more than ~31 frames on one port
    was lost in the kernel, before BMv2 saw it and before any counter (docs/bmv2.md).
    """
    for iface in ifaces:
        disable_offloads(iface)
        still_on = offloads_on(iface)
        if still_on:
            raise RuntimeError(
                f"offloads {', '.join(still_on)} stay on at switch port {iface}: the switch "
                "would lose bursts of more than ~31 frames there; turn them off "
                f"(ethtool -K {iface} tso off gso off gro off lro off) and start it again"
            )


def open_raw(iface: str, rcvbuf: int = 4 << 20) -> socket.socket:
    """A non-blocking raw socket sending and receiving every frame on iface."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((iface, 0))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    recv_frames(sock, limit=100000)  # frames of other links caught before bind()
    return sock


def recv_frames(sock: socket.socket, limit: int = 256) -> list[bytes]:
    """Every frame waiting on sock (up to limit), leaving out our own outgoing ones."""
    frames = []
    for _ in range(limit):
        try:
            data, addr = sock.recvfrom(MAX_DATAGRAM_BYTES)
        except (BlockingIOError, InterruptedError):
            break
        if addr[2] != PACKET_OUTGOING:
            frames.append(data)
    return frames


class RawPort:
    """A test host's view of a link: send frames, wait for frames that match."""

    def __init__(self, iface: str) -> None:
        self.iface = iface
        self.sock = open_raw(iface)

    def send(self, frame: bytes) -> None:
        """Transmit one frame."""
        self.sock.send(frame)

    def receive(self, timeout: float, count: int | None = None) -> list[bytes]:
        """Frames queued or arriving within timeout seconds, returning early once `count`
        arrived (a timeout of 0 reads what is queued)."""
        deadline = time.monotonic() + timeout
        frames: list[bytes] = []
        while count is None or len(frames) < count:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                frames.extend(recv_frames(self.sock))
            if left == 0.0:
                break
        return frames

    def drain(self) -> None:
        """Discard whatever is queued."""
        recv_frames(self.sock, limit=100000)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def main(argv: list[str]) -> int:
    """`python3 rawsock.py IFACE...`: turn_offloads_off for a switch started by other means
    (the Docker example's BMv2 image has Python 3 but neither this package nor ethtool)."""
    try:
        for iface in argv:
            socket.if_nametoindex(iface)  # OSError: no such interface (nothing to turn off)
        turn_offloads_off(argv)
    except (RuntimeError, OSError) as exc:
        print(f"cannot prepare switch ports {' '.join(argv)}: {exc}", file=sys.stderr)
        return 1
    print(f"offloads off on {' '.join(argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
