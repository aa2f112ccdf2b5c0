"""bench.link_physics: what the links allow the switch and gloo's ring."""

from __future__ import annotations

import pytest

from bench.link_physics import (
    cpu_bound_mbit,
    link_bound,
    ring_fraction,
    switch_header_bytes,
    switch_wire_share,
    tcp_wire_share,
)


def test_header_overhead_of_an_aggregation_packet():
    # Ethernet 14, IPv4 20, UDP 8, aggregation header 16 around 256 cells of 4 bytes
    assert switch_header_bytes(256) == 58
    assert switch_wire_share(256) == pytest.approx(1024 / 1082)
    assert switch_wire_share(64) < switch_wire_share(256)


def test_ring_sends_two_w_minus_one_over_w():
    assert ring_fraction(1) == 0
    assert ring_fraction(2) == 1
    assert ring_fraction(4) == 1.5
    assert ring_fraction(8) == 1.75
    with pytest.raises(ValueError):
        ring_fraction(0)


def test_tcp_segments_carry_1448_of_1514_bytes():
    assert tcp_wire_share() == pytest.approx(1448 / 1514)


def test_ideal_times_ratio_and_goodput():
    b = link_bound(256 * 1000, 4, 100.0, 256)
    assert b.switch_s == pytest.approx(1000 * 1082 * 8 / 100e6)
    assert b.ring_s == pytest.approx(1.5 * 1024_000 * 1514 / 1448 * 8 / 100e6)
    assert b.ratio == pytest.approx(1.5 * (1514 / 1448) / (1082 / 1024))
    assert b.switch_goodput_share == pytest.approx(1024 / 1082)
    # the ratio does not depend on the rate; W = 8 gains more than W = 4
    assert link_bound(256 * 1000, 4, 1000.0, 256).ratio == pytest.approx(b.ratio)
    assert link_bound(256 * 1000, 8, 100.0, 256).ratio > b.ratio


def test_a_partial_last_packet_and_extra_phases_cost_whole_packets():
    assert link_bound(257, 4, 100.0, 256).switch_s == pytest.approx(2 * 1082 * 8 / 100e6)
    more = link_bound(256 * 1000, 4, 100.0, 256, switch_packets=1010)
    assert more.switch_goodput_share == pytest.approx(1000 / 1010 * 1024 / 1082)


@pytest.mark.parametrize(("n", "mbit"), [(0, 100.0), (10, 0.0), (10, -5.0)])
def test_bad_sizes_and_rates_are_refused(n, mbit):
    with pytest.raises(ValueError):
        link_bound(n, 4, mbit)


def test_cpu_bound_from_a_packet_rate():
    assert cpu_bound_mbit(10_000, 256) == pytest.approx(10_000 * 1024 * 8 / 1e6)
