"""The low-bit lane codecs end to end through both switches (ADD16 / ADD8 in the data
plane): the decoded sums equal the simulation's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from test_transport import WORLD, close, make_transports, run_workers

from homagg.lab.fabric import Fabric
from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import bmv2_available
from homagg.worker.codecs import ErrorFeedback, LowBit, simulate

pytestmark = pytest.mark.skipif(
    not have_privileges(), reason="transport tests need root and iproute2 (network namespaces)"
)
TARGETS = [
    "refswitch",
    pytest.param(
        "bmv2",
        marks=pytest.mark.skipif(
            not bmv2_available(), reason="simple_switch_grpc is not installed (docs/bmv2.md)"
        ),
    ),
]


@pytest.fixture(scope="module", params=TARGETS)
def fabric(request, tmp_path_factory):
    with Fabric(request.param, WORLD, tmp_path_factory.mktemp(request.param)) as f:
        for h in f.hosts:
            h.enable_ip_stack()
        yield f


@pytest.mark.parametrize("bits", [16, 8])
def test_lowbit_through_the_switch_equals_the_simulation(fabric, bits):
    rng = np.random.default_rng(bits)
    # Several exponent blocks of different scales, negative values, a zero block.
    scales = np.repeat([1e-3, 1.0, 50.0, 0.0, 3e-6], 1024)[:4000]
    xs = [(rng.standard_normal(scales.size) * scales).astype(np.float32) for _ in range(WORLD)]

    def make(r: int) -> ErrorFeedback:
        return ErrorFeedback(LowBit(WORLD, bits=bits, seed=100 + r))

    sim = [make(r) for r in range(WORLD)]
    real = [make(r) for r in range(WORLD)]
    transports = make_transports(fabric)
    try:
        for _step in range(2):  # the second step carries the first one's residual
            expected = simulate(sim, xs)
            got = run_workers(transports, lambda r, t: t.run(real[r].aggregate(xs[r])))
            for r in range(WORLD):
                np.testing.assert_array_equal(got[r], expected[r])
    finally:
        close(transports)
