"""Fixtures shared by the P4Runtime tests: the hand-written test P4Info and a reference
switch's P4Runtime server on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from homagg.p4rt.p4info import P4InfoIndex
from homagg.refswitch.device import Device
from homagg.refswitch.p4runtime_server import P4RuntimeServer

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@dataclass
class RunningSwitch:
    """A Device served over P4Runtime on 127.0.0.1."""

    device: Device
    server: P4RuntimeServer
    address: str
    device_id: int


@pytest.fixture(scope="session")
def test_p4info_path() -> Path:
    """The text-format P4Info of tests/fixtures (exact, lpm, ternary, range/optional tables)."""
    return FIXTURES / "test.p4info.txtpb"


@pytest.fixture
def test_p4info(test_p4info_path: Path) -> P4InfoIndex:
    """The test P4Info, indexed."""
    return P4InfoIndex.from_text_file(test_p4info_path)


@pytest.fixture
def p4rt_switch() -> Iterator[RunningSwitch]:
    """A fresh Device with no pipeline, served on a free port (device id 0); stopped afterwards."""
    device = Device()
    server = P4RuntimeServer(device, 0, "127.0.0.1:0")
    port = server.start()
    try:
        yield RunningSwitch(device, server, f"127.0.0.1:{port}", 0)
    finally:
        server.stop(0)
