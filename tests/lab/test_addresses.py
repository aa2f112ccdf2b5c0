"""The one host-address scheme: 10.0.0.<i+1>, 02:00:00:00:01:<i+1>, switch port i+1."""

from __future__ import annotations

import pytest

from homagg.lab.addresses import MAX_HOSTS, SERVICE_IP, host_entry, host_ip, host_mac


def test_scheme_and_edges() -> None:
    assert host_entry(0) == {"ip": "10.0.0.1", "mac": "02:00:00:00:01:01", "switch_port": 1}
    assert host_ip(MAX_HOSTS - 1) == "10.0.0.253" != SERVICE_IP
    assert host_mac(99) == "02:00:00:00:01:64"
    for bad in (-1, MAX_HOSTS):
        with pytest.raises(ValueError, match=r"outside 0\.\.252"):
            host_ip(bad)
