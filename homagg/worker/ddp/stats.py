"""What the DDP hook did (`HookStats`, the state's `stats`), and the two places that count
into it from a measured interval: a switch run's wire use and an agreement's time."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from homagg.worker.transport.switch_transport import SwitchTransport


@dataclass
class HookStats:
    """What the hook did since it was made: buckets per path, agreements, bytes, time."""

    switch_buckets: int = 0
    fallback_buckets: int = 0
    fallbacks: int = 0  # switch -> fallback transitions
    agreements: int = 0  # tiny all_reduces of the decision protocol (process group)
    switch_agreements: int = 0  # buckets agreed by a verdict packet through the switch
    dense_bytes: int = 0  # float32 bytes of the buckets sent through the switch
    wire_bytes: int = 0  # aggregation frames sent for them (retransmissions included)
    wire_cells: int = 0  # the cells those frames carried
    retransmissions: int = 0
    switch_seconds: float = 0.0
    agreement_seconds: float = 0.0
    fallback_reasons: Counter = field(default_factory=Counter)
    host_buckets: int = 0  # buckets codec="auto" sent to the host all_reduce on purpose
    auto_choices: Counter = field(default_factory=Counter)  # codec="auto": bucket-steps per choice
    leased_steps: int = 0  # codec="auto": steps that skipped the agreement (host lease)
    switch_decisions: int = 0  # codec="auto": decisions agreed by one packet through the switch
    decision_seconds: float = 0.0  # ... their time (also in agreement_seconds)
    decision_repairs: int = 0  # codec="auto": decisions repaired over the process group

    def agreed(self, start: float) -> None:
        """Count one agreement that began at `start` (perf_counter) and ended now."""
        self.agreements += 1
        self.agreement_seconds += time.perf_counter() - start

    def decided_by_switch(self, start: float) -> None:
        """Count one decision the switch answered, begun at `start` (perf_counter)."""
        seconds = time.perf_counter() - start
        self.switch_decisions += 1
        self.decision_seconds += seconds
        self.agreement_seconds += seconds

    @contextmanager
    def switch_run(self, transport: SwitchTransport) -> Iterator[None]:
        """Count the time and the frames (retransmissions included) of the switch run
        inside the block, whether it succeeds or not."""
        sent, retransmitted = transport.stats.packets_sent, transport.stats.retransmissions
        start = time.perf_counter()
        try:
            yield
        finally:
            self.switch_seconds += time.perf_counter() - start
            packets = transport.stats.packets_sent - sent
            self.wire_bytes += packets * transport.config.frame_bytes
            self.wire_cells += packets * transport.config.cells_per_packet
            self.retransmissions += transport.stats.retransmissions - retransmitted
