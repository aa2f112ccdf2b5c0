"""The packet suite runs every test against each switch target with the same
expectations: the reference switch always, BMv2 when simple_switch_grpc is installed, the
eBPF target where clang, libbpf and the kernel allow it."""

from __future__ import annotations

import pytest

from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import bmv2_available, ebpf_problem

NEEDS_ROOT = pytest.mark.skipif(
    not have_privileges(), reason="packet tests need root and iproute2 (network namespaces)"
)
TARGETS = [
    pytest.param("refswitch", id="refswitch"),
    pytest.param(
        "bmv2",
        id="bmv2",
        marks=pytest.mark.skipif(
            not bmv2_available(),
            reason="simple_switch_grpc is not installed (BMv2 is built by "
            "hand, see docs/bmv2.md); the reference switch ran instead",
        ),
    ),
    pytest.param(
        "ebpf",
        id="ebpf",
        marks=pytest.mark.skipif(bool(ebpf_problem()), reason=f"eBPF target: {ebpf_problem()}"),
    ),
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/packet/" in str(item.fspath):
            item.add_marker(NEEDS_ROOT)


@pytest.fixture(scope="module", params=TARGETS)
def target(request) -> str:
    """The switch kind a packet test module runs against."""
    return request.param
