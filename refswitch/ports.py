"""The switch's ports: raw sockets on network interfaces, as BMv2's `-i PORT@IFACE`."""

from __future__ import annotations

import logging
import selectors
import socket

from testnet.rawsock import disable_offloads, open_raw, recv_frames

log = logging.getLogger(__name__)


def parse_port_spec(spec: str) -> tuple[int, str]:
    """'3@veth3' -> (3, 'veth3'); raises ValueError with the expected form."""
    port, sep, iface = spec.partition("@")
    if not sep or not port.isdigit() or not iface or not 0 <= int(port) < 511:
        raise ValueError(f"bad interface {spec!r}: expected PORT@IFACE with PORT in 0..510")
    return int(port), iface


class PortSet:
    """Raw sockets on the switch's interfaces; poll() returns frames with their port."""

    def __init__(self, ports: dict[int, str]) -> None:
        self._socks: dict[int, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self.tx_errors = 0
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
            out.extend((key.data, frame) for frame in recv_frames(key.fileobj))
        return out

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
