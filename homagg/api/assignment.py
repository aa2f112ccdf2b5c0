"""What the job API tells a worker once its job is ready: the controller builds it from the
job record, the worker reads it from the WaitReady answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Assignment:
    """What a worker needs once its job is ready (see Assignment in homagg/api/jobs.proto)."""

    job_id: int
    rank: int
    world_size: int
    switch: str
    service_ip: str
    udp_port: int
    switch_mac: str
    pool_size: int
    cells_per_packet: int
    codec: str
    heartbeat_interval_s: float
    lease_s: float
    lane_ops: bool = True  # the program adds ADD16 / ADD8 lanes (SwitchConfig.lane_ops)

    @classmethod
    def from_message(cls, msg: Any) -> Assignment:
        """From the protobuf Assignment (same field names), e.g. on the worker's side."""
        return cls(**{f: getattr(msg, f) for f in cls.__dataclass_fields__})
