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


# The test tiers (pytest -m): every test gets exactly one of unit, netns, bmv2 and mininet,
# from what it needs as its skip conditions say, so that no test file has to repeat it;
# `slow` marks the few tests that take long without needing anything special.
TIERS = {
    "unit": "needs nothing special: no root, no namespaces, no BMv2, no Mininet (make check)",
    "netns": "needs root: network namespaces, veth links, raw sockets or shaped links",
    "bmv2": "runs on BMv2 (simple_switch_grpc), skipped where it is not installed",
    "mininet": "runs `make run` in Mininet (Debian's mininet, root)",
    "slow": "a unit test that takes 5 s or more on 2 cores (make check leaves it out)",
}
_NEEDS = (
    ("mininet", ("mininet",)),
    ("bmv2", ("simple_switch_grpc", "bmv2")),
    ("netns", ("root", "namespace", "raw socket", "privilege")),
)
_NETNS_DIRS = ("tests/packet/", "tests/faults/", "tests/examples/")


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def tier_of(item: pytest.Item) -> str:
    """The tier a test belongs to, from its skip conditions' reasons and its directory."""
    reasons = " ".join(str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
    reasons = reasons.lower()
    for tier, words in _NEEDS:
        if any(w in reasons for w in words):
            return tier
    path = Path(str(item.fspath)).as_posix()
    if any(d in path for d in _NETNS_DIRS):
        return "netns"
    return "unit"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(t) for t in ("unit", "netns", "bmv2", "mininet")):
            item.add_marker(getattr(pytest.mark, tier_of(item)))
