"""The HTTP endpoint that serves one process's Prometheus metrics (the controller's, a switch
process's): prometheus_client's own WSGI server on a registry of the caller's (never the
library's global one), on a loopback address unless the caller explicitly allows another."""

from __future__ import annotations

import ipaddress
import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)
DEFAULT_METRICS_HOST = "127.0.0.1"


class MetricsExposureError(ValueError):
    """A metrics address other hosts could reach, without the explicit option that allows it."""


def split_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as [ADDR]:PORT) -> (host, port); ValueError naming the form."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT for the metrics endpoint, got {address!r}")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    """True for a loopback IP address or 'localhost' (names are not resolved: a name that
    resolves elsewhere later must not count as loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class MetricsEndpoint:
    """`registry` served at http://ADDRESS/metrics by a daemon thread until close()."""

    def __init__(
        self, registry: CollectorRegistry, address: str, allow_non_loopback: bool = False
    ) -> None:
        host, port = split_address(address)
        if not is_loopback_host(host) and not allow_non_loopback:
            raise MetricsExposureError(
                f"metrics address {address} is not a loopback address: whoever reaches it "
                "reads every job's numbers; listen on 127.0.0.1, or allow it explicitly "
                "(docs/controller.md, Metrics)"
            )
        if not is_loopback_host(host):
            log.warning("metrics on %s: every host that reaches it can read them", address)
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, host, registry)
        self.host = host
        self.port: int = self._server.server_port

    @property
    def url(self) -> str:
        """Where a scraper reads the metrics."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(2)
