"""The switch's ports: raw sockets on network interfaces, as BMv2's `-i PORT@IFACE`."""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import struct

from homagg.lab.rawsock import disable_offloads, open_raw, recv_frames
from homagg.wire.constants import MAX_SWITCH_PORT

log = logging.getLogger(__name__)
SOL_PACKET = 263  # linux/socket.h
PACKET_STATISTICS = 6  # linux/if_packet.h: struct tpacket_stats {tp_packets, tp_drops}
# What a raw socket's read reports when its interface went down or away (a veth whose peer
# namespace ended, as at every Mininet or fabric shutdown): the port ends, the switch goes on.
LINK_GONE = frozenset({errno.ENETDOWN, errno.ENODEV, errno.ENXIO})


def socket_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped on an AF_PACKET socket since the last call (its receive
    buffer was full: the switch did not read fast enough). Reading resets the kernel's count."""
    _, drops = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    return drops


def parse_port_spec(spec: str) -> tuple[int, str]:
    """'3@veth3' -> (3, 'veth3'); raises ValueError with the expected form."""
    port, sep, iface = spec.partition("@")
    if not sep or not port.isdigit() or not iface or not 0 <= int(port) <= MAX_SWITCH_PORT:
        raise ValueError(
            f"bad interface {spec!r}: expected PORT@IFACE with PORT in 0..{MAX_SWITCH_PORT}"
        )
    return int(port), iface


class PortSet:
    """Raw sockets on the switch's interfaces; poll() returns frames with their port."""

    def __init__(self, ports: dict[int, str]) -> None:
        self._socks: dict[int, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self.tx_errors = 0
        # per port, frames the kernel dropped before the switch read them (receive buffer
        # full): counted so that every frame sent to the switch is accounted for
        self.kernel_drops: dict[int, int] = dict.fromkeys(ports, 0)
        try:
            for port, iface in ports.items():
                disable_offloads(iface)
                sock = open_raw(iface)
                self._socks[port] = sock
                self._selector.register(sock, selectors.EVENT_READ, port)
        except OSError:
            self.close()
            raise
        self.ports = dict(ports)

    def poll(self, timeout: float) -> list[tuple[int, bytes]]:
        """Frames received within timeout, as (port, frame), in arrival order per port."""
        out: list[tuple[int, bytes]] = []
        for key, _ in self._selector.select(timeout):
            try:
                frames = recv_frames(self._socks[key.data])
            except OSError as exc:
                if exc.errno not in LINK_GONE:
                    raise
                self._close_port(key.data, exc)
                continue
            out.extend((key.data, frame) for frame in frames)
        return out

    def _close_port(self, port: int, exc: OSError) -> None:
        """A port whose link went away ends quietly: later frames to it are dropped as to a
        port without an interface (any other socket error still ends the switch)."""
        log.info("port %d (%s): link gone (%s); port closed", port, self.ports[port], exc.strerror)
        sock = self._socks.pop(port)
        self._selector.unregister(sock)
        sock.close()

    def update_kernel_drops(self) -> dict[int, int]:
        """Add the kernel's new drops of every port to kernel_drops; returns the new ones."""
        new: dict[int, int] = {}
        for port, sock in self._socks.items():
            try:
                dropped = socket_drops(sock)
            except OSError as exc:
                log.debug("PACKET_STATISTICS on port %d failed: %s", port, exc)
                continue
            if dropped:
                self.kernel_drops[port] += dropped
                new[port] = dropped
        return new

    def send(self, port: int, frame: bytes) -> None:
        """Transmit on port; a port without an interface drops the frame, as on BMv2."""
        sock = self._socks.get(port)
        if sock is None:
            log.debug("no interface on port %d: frame dropped", port)
            return
        try:
            sock.send(frame)
        except OSError as exc:  # e.g. link down or queue full: the frame is lost, like on a wire
            self.tx_errors += 1
            log.debug("send on port %d failed: %s", port, exc)

    def close(self) -> None:
        """Close every socket."""
        for sock in self._socks.values():
            self._selector.unregister(sock)
            sock.close()
        self._socks.clear()
        self._selector.close()
