"""One eBPF switch: the reference switch's Device and P4Runtime server as the front end,
the kernel program on the ports as the data plane (homagg/ebpf/dataplane.py)."""

from __future__ import annotations

import logging
import threading

from homagg.ebpf.build import build
from homagg.ebpf.dataplane import KernelDataPlane, xdp_mode
from homagg.refswitch.device import Device
from homagg.refswitch.metrics import SwitchCollector
from homagg.refswitch.p4runtime_server import P4RuntimeServer
from homagg.refswitch.switch import check_program
from homagg.wire import p4names
from homagg.wire.constants import DropReason

log = logging.getLogger(__name__)


class EbpfSwitch:
    """Answers P4Runtime exactly like the reference switch (same checks, same Device) and
    forwards in the kernel; the program detaches when the process ends."""

    def __init__(
        self,
        ports: dict[int, str],
        grpc_address: str,
        device_id: int = 0,
        stats_interval: float = 10.0,
    ) -> None:
        self.device = Device()
        self.ports = dict(ports)
        self.dataplane = KernelDataPlane(build(), ports, self.device, xdp_mode())
        log.info(
            "XDP stage: %s", ", ".join(f"{i} {m}" for i, m in self.dataplane.xdp_modes.items())
        )
        self.server = P4RuntimeServer(
            self.device,
            device_id,
            grpc_address,
            validate_config=check_program,
            observer=self.dataplane,
        )
        self.stats_interval = stats_interval
        self._stop = threading.Event()

    def start(self) -> int:
        """Start the P4Runtime server; returns its port."""
        return self.server.start()

    def stop(self) -> None:
        """Ask run() to return."""
        self._stop.set()

    def run(self) -> None:
        """Wait until stop(), logging the drop counts every stats_interval seconds when they
        changed (the kernel forwards; this process only serves the control plane)."""
        reported: dict[str, int] = {}
        while not self._stop.wait(self.stats_interval):
            drops = self._drops()
            if drops != reported:
                log.info("drops %s", ", ".join(f"{k}={v}" for k, v in sorted(drops.items())))
                reported = drops

    def _drops(self) -> dict[str, int]:
        """The program's drops by reason, ingress and egress (the maps read now)."""
        with self.device.lock:
            if self.device.p4info is None:
                return {}
            self.dataplane.refresh()
            drops: dict[str, int] = {}
            for name in (p4names.INGRESS_DROPS, p4names.EGRESS_DROPS):
                counter = self.device.counter(name)
                for r in DropReason:
                    if counter.packets[r]:
                        drops[r.name] = drops.get(r.name, 0) + counter.packets[r]
            return drops

    def collector(self) -> SwitchCollector:
        """This switch's metrics (homagg/refswitch/metrics.py): its ports' interface counters
        and the program's drops (no sockets: the kernel forwards)."""
        return SwitchCollector(self.ports, self._drops)

    def close(self) -> None:
        """Stop the server and unload the program."""
        self.server.stop(0.5)
        self.dataplane.close()
