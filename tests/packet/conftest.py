"""The packet suite runs every test against each switch target with the same
expectations: the reference switch always, BMv2 when simple_switch_grpc is installed, the
eBPF target where clang, libbpf and the kernel allow it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from homagg.environment import EBPF_XDP_ENV
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


# The eBPF target runs these modules with its XDP stage in front (native XDP: each round's
# last contribution in TC, the rest in XDP), the others as it runs by default (the TC
# program alone): the same expectations hold for both forms.
XDP_MODULES = frozenset({"test_concurrency", "test_drops", "test_pool_edges"})


@pytest.fixture(scope="module", params=TARGETS)
def target(request) -> Iterator[str]:
    """The switch kind a packet test module runs against (for the eBPF target in
    XDP_MODULES, the switch processes the module starts get HOMAGG_EBPF_XDP=native)."""
    module = request.module.__name__.rpartition(".")[2]
    with pytest.MonkeyPatch.context() as env:
        if request.param == "ebpf" and module in XDP_MODULES:
            env.setenv(EBPF_XDP_ENV, "native")
        yield request.param
