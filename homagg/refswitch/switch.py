"""One reference switch: forwarding state, P4Runtime server, ports and the packet loop."""

from __future__ import annotations

import json
import logging
import threading
import time

from homagg.p4rt.api import p4info_pb2
from homagg.refswitch.device import Device
from homagg.refswitch.metrics import SwitchCollector
from homagg.refswitch.p4runtime_server import P4RuntimeServer
from homagg.refswitch.pipeline import Pipeline
from homagg.refswitch.ports import PortSet
from homagg.wire import p4names
from homagg.wire.constants import CELL_BITS, CELLS_PER_PKT, DropReason

log = logging.getLogger(__name__)
KERNEL_DROPS_REASON = DropReason.KERNEL_RX_OVERFLOW  # frames lost before the pipeline
KERNEL_DROPS_INTERVAL = 1.0  # seconds between reads of the sockets' drop counts


def check_program(p4info: p4info_pb2.P4Info, device_config: bytes) -> None:
    """Refuse a pipeline this model does not implement (ValueError, sent as INVALID_ARGUMENT)."""
    names = {t.preamble.name for t in p4info.tables} | {c.preamble.name for c in p4info.counters}
    missing = [
        n for n in (*p4names.TABLES, *p4names.TREE_TABLES, *p4names.COUNTERS) if n not in names
    ]
    if missing:
        raise ValueError(f"P4Info is not the homagg program (missing {', '.join(missing)})")
    # A table this model does not run would take entries and silently do nothing with them.
    unknown = sorted(
        {t.preamble.name for t in p4info.tables} - {*p4names.TABLES, *p4names.TREE_TABLES}
    )
    if unknown:
        raise ValueError(
            f"P4Info has tables this switch model does not implement ({', '.join(unknown)}): "
            "push the homagg program this switch was built with"
        )
    if device_config:
        try:
            config = json.loads(device_config)
            types = {h["name"]: h for h in config["header_types"]}
            bits = sum(f[1] for f in types["cells_h"]["fields"])
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"device config is not the homagg BMv2 JSON: {exc}") from exc
        if bits != CELL_BITS * CELLS_PER_PKT:
            raise ValueError(
                f"program built for {bits // CELL_BITS} cells per packet, this switch "
                f"model has {CELLS_PER_PKT}"
            )


class ReferenceSwitch:
    """Stands in for simple_switch_grpc: same ports, same P4Runtime, same packet semantics."""

    def __init__(
        self,
        ports: dict[int, str],
        grpc_address: str,
        device_id: int = 0,
        stats_interval: float = 10.0,
    ) -> None:
        self.device = Device()
        self.pipeline = Pipeline(self.device)
        self.server = P4RuntimeServer(
            self.device, device_id, grpc_address, validate_config=check_program
        )
        self.ports = PortSet(ports) if ports else None
        self.stats_interval = stats_interval
        self._stop = threading.Event()
        self.packets_in = 0
        self.packets_out = 0

    def start(self) -> int:
        """Start the P4Runtime server; returns its port."""
        return self.server.start()

    def stop(self) -> None:
        """Ask run() to return."""
        self._stop.set()

    def run(self) -> None:
        """Forward packets until stop(); logs a drop summary every stats_interval seconds."""
        next_stats = time.monotonic() + self.stats_interval
        next_kernel = time.monotonic() + KERNEL_DROPS_INTERVAL
        reported: dict[str, int] = {}
        while not self._stop.is_set():
            if self.ports is None:
                self._stop.wait(0.2)
            else:
                for port, frame in self.ports.poll(0.2):
                    self.packets_in += 1
                    for out_port, out_frame in self.pipeline.process(port, frame):
                        self.ports.send(out_port, out_frame)
                        self.packets_out += 1
            if self.ports is not None and time.monotonic() >= next_kernel:
                next_kernel = time.monotonic() + KERNEL_DROPS_INTERVAL
                self._count_kernel_drops()
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + self.stats_interval
                drops = dict(self.pipeline.drops)
                if drops != reported:
                    log.info(
                        "packets in %d out %d; drops %s",
                        self.packets_in,
                        self.packets_out,
                        ", ".join(f"{k}={v}" for k, v in sorted(drops.items())),
                    )
                    reported = drops

    def _count_kernel_drops(self) -> None:
        """Frames the kernel dropped before the pipeline saw them: a drop reason of their own,
        KERNEL_DROPS_REASON, in the drop summary and in the P4 ingress drop counter (so
        `aggctl counters` shows them; per port in ports.kernel_drops)."""
        assert self.ports is not None
        for port, dropped in self.ports.update_kernel_drops().items():
            self.pipeline.drops[KERNEL_DROPS_REASON.name] += dropped
            with self.device.lock:
                if self.device.p4info is not None:  # no pipeline: no counter to count them in
                    drops = self.device.counter(p4names.INGRESS_DROPS)
                    drops.add(KERNEL_DROPS_REASON, dropped)
            log.warning(
                "port %d: the kernel dropped %d frames (socket receive buffer full)", port, dropped
            )

    def collector(self) -> SwitchCollector:
        """This switch's metrics (homagg/refswitch/metrics.py): its ports, its sockets'
        overflows and the pipeline's drops, read when scraped."""
        ports = self.ports
        return SwitchCollector(
            ports.ports if ports is not None else {},
            lambda: dict(self.pipeline.drops),
            (lambda: dict(ports.kernel_drops)) if ports is not None else None,
        )

    def close(self) -> None:
        """Stop the server and close the ports."""
        self.server.stop(0.5)
        if self.ports is not None:
            self._count_kernel_drops()
            self.ports.close()
