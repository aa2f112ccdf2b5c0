"""The V1Switch of p4src/homagg.p4: parser, SwitchIngress, the replication engine,
SwitchEgress and deparser, over the forwarding state of one Device."""

from __future__ import annotations

import logging
from collections import Counter

from homagg.refswitch.aggregation import AggregationRegisters, aggregation
from homagg.refswitch.delivery import result_delivery
from homagg.refswitch.deparser import compute_checksum, deparse
from homagg.refswitch.device import Device
from homagg.refswitch.forwarding import forwarding
from homagg.refswitch.packet import Headers, Metadata, StandardMetadata, dup, mark_to_drop
from homagg.refswitch.parser import parse
from homagg.wire import p4names
from homagg.wire.constants import DROP_PORT, DropReason

log = logging.getLogger(__name__)


class Pipeline:
    """Runs frames through the program; registers live here and reset with each pipeline push."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.registers = AggregationRegisters()
        self.drops: Counter[str] = Counter()
        self._config_generation = device.config_generation

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """One frame in on ingress_port; the (egress port, frame) pairs it produces."""
        device = self.device
        with device.lock:
            if device.p4info is None:
                return []  # no pipeline yet: BMv2 drops everything too
            if device.config_generation != self._config_generation:
                self.registers = AggregationRegisters()
                self._config_generation = device.config_generation
            hdr, error = parse(frame)
            std = StandardMetadata(
                ingress_port=ingress_port, packet_length=len(frame), parser_error=error
            )
            meta = Metadata()
            self._ingress(hdr, meta, std)
            if std.mcast_grp:
                out = []
                for port, rid in device.multicast_groups.get(std.mcast_grp, ()):
                    replica_std = dup(std)
                    replica_std.egress_port, replica_std.egress_rid = port, rid
                    sent = self._egress(hdr.clone(), dup(meta), replica_std)
                    if sent is not None:
                        out.append((port, sent))
                return out
            if std.egress_spec == DROP_PORT:
                return []
            std.egress_port, std.egress_rid = std.egress_spec, 0
            sent = self._egress(hdr, meta, std)
            return [] if sent is None else [(std.egress_port, sent)]

    def _drop(self, counter: str, meta: Metadata, std: StandardMetadata) -> None:
        reason = DropReason(meta.drop_reason).name
        self.drops[reason] += 1
        log.debug("drop %s (port %d, %d bytes)", reason, std.ingress_port, std.packet_length)
        self.device.counter(counter).count(meta.drop_reason, std.packet_length)
        mark_to_drop(std)

    def _ingress(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
        """SwitchIngress.apply()."""
        if std.parser_error != "NoError":
            meta.drop_reason = DropReason.TRUNCATED
        else:
            forwarding(self.device, hdr, meta, std)
            if meta.to_aggregation == 1:
                aggregation(self.device, self.registers, hdr, meta, std)
        if meta.drop_reason != DropReason.NONE:
            self._drop(p4names.INGRESS_DROPS, meta, std)
        elif meta.absorbed == 1:
            mark_to_drop(std)

    def _egress(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> bytes | None:
        """SwitchEgress.apply(), then checksum and deparser; None when the packet is dropped."""
        meta.drop_reason = DropReason.NONE
        # Only what the aggregation emitted as a result: a routed frame keeps its headers.
        if meta.to_delivery == 1:
            result_delivery(self.device, hdr, meta, std)
        if meta.drop_reason != DropReason.NONE:
            self._drop(p4names.EGRESS_DROPS, meta, std)
            return None
        compute_checksum(hdr)
        return deparse(hdr)
