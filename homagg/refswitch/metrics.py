"""A switch process's own Prometheus metrics (the reference switch and the eBPF switch, with
--metrics-port): per port the packets its interfaces received and sent and the frames they
dropped (the kernel's interface counters, /proc/net/dev of the switch's network namespace),
the socket receive overflows where the switch reads its ports through sockets, and the
pipeline's drops by reason. Everything is read at scrape time from counters the switch keeps
anyway: a scrape adds no work to the packet path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from homagg.metrics_endpoint import MetricsEndpoint

PROC_NET_DEV = Path("/proc/self/net/dev")  # the interfaces of this process's namespace
RX_PACKETS, RX_DROP, TX_PACKETS = 1, 3, 9  # columns after "IFACE:" (see proc(5))


def interface_counters(text: str) -> dict[str, tuple[int, int, int]]:
    """/proc/net/dev's text -> per interface (received packets, receive drops, sent packets)."""
    out = {}
    for line in text.splitlines()[2:]:  # two header lines
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) > TX_PACKETS:
            out[name.strip()] = (
                int(fields[RX_PACKETS]),
                int(fields[RX_DROP]),
                int(fields[TX_PACKETS]),
            )
    return out


class SwitchCollector(Collector):
    """The families of one switch process. `drops` gives the pipeline's drops by reason name;
    `overflows`, where the switch has sockets, their kernel receive overflows per port."""

    def __init__(
        self,
        ports: dict[int, str],
        drops: Callable[[], dict[str, int]],
        overflows: Callable[[], dict[int, int]] | None = None,
        proc_net_dev: Path = PROC_NET_DEV,
    ) -> None:
        self.ports, self.drops, self.overflows = dict(ports), drops, overflows
        self.proc_net_dev = proc_net_dev

    def collect(self) -> Iterator[CounterMetricFamily]:
        received = CounterMetricFamily(
            "homagg_switch_port_received_packets",
            "Packets the port's interface received (kernel interface counter)",
            labels=["port"],
        )
        sent = CounterMetricFamily(
            "homagg_switch_port_sent_packets",
            "Packets the port's interface sent (kernel interface counter)",
            labels=["port"],
        )
        dropped = CounterMetricFamily(
            "homagg_switch_port_interface_drops",
            "Frames the port's interface dropped on receive (kernel interface counter)",
            labels=["port"],
        )
        counters = interface_counters(self.proc_net_dev.read_text()) if self.ports else {}
        for port, iface in sorted(self.ports.items()):
            if iface in counters:
                rx, rx_drop, tx = counters[iface]
                received.add_metric([str(port)], rx)
                dropped.add_metric([str(port)], rx_drop)
                sent.add_metric([str(port)], tx)
        yield from (received, sent, dropped)
        if self.overflows is not None:
            overflows = CounterMetricFamily(
                "homagg_switch_port_socket_overflows",
                "Frames the kernel dropped because the switch's socket on the port was full",
                labels=["port"],
            )
            for port, count in sorted(self.overflows().items()):
                overflows.add_metric([str(port)], count)
            yield overflows
        pipeline = CounterMetricFamily(
            "homagg_switch_pipeline_drops",
            "Packets the switch's pipeline dropped, by reason (docs/naming.md)",
            labels=["reason"],
        )
        for reason, count in sorted(self.drops().items()):
            pipeline.add_metric([reason], count)
        yield pipeline


def serve_switch_metrics(collector: Collector, host: str, port: int) -> MetricsEndpoint:
    """The collector served on its own registry at HOST:PORT. Loopback is the default; another
    host was asked for explicitly (--metrics-addr), so it is allowed, with a warning."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return MetricsEndpoint(registry, address, allow_non_loopback=True)
