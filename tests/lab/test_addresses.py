"""The one host-address scheme: 10.0.0.<i+1>, 02:00:00:00:01:<i+1>, switch port i+1."""

from __future__ import annotations

import pytest

from homagg.lab.addresses import (
    MAX_HOSTS,
    MAX_SUBNET,
    SERVICE_IP,
    SWITCH_MAC,
    host_entry,
    host_ip,
    host_mac,
    switch_mac,
)


def test_switch_macs_differ_per_subnet_and_from_every_host() -> None:
    assert SWITCH_MAC == switch_mac(0) == "02:00:00:00:00:fe"
    macs = {switch_mac(k) for k in range(MAX_SUBNET + 1)}
    assert len(macs) == MAX_SUBNET + 1 and not macs & {host_mac(i) for i in range(MAX_HOSTS)}
    with pytest.raises(ValueError, match="subnet"):
        switch_mac(MAX_SUBNET + 1)


def test_scheme_and_edges() -> None:
    assert host_entry(0) == {"ip": "10.0.0.1", "mac": "02:00:00:00:01:01", "switch_port": 1}
    assert host_ip(MAX_HOSTS - 1) == "10.0.0.253" != SERVICE_IP
    assert host_mac(99) == "02:00:00:00:01:64"
    for bad in (-1, MAX_HOSTS):
        with pytest.raises(ValueError, match=r"outside 0\.\.252"):
            host_ip(bad)
