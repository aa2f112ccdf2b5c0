"""The eBPF switch's XDP stage mode comes from HOMAGG_EBPF_XDP (no root, no kernel)."""

from __future__ import annotations

import pytest

from homagg.ebpf.dataplane import XDP_MODES, xdp_mode
from homagg.ebpf.libbpf import XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE
from homagg.environment import EBPF_XDP_ENV


def test_off_is_the_default(monkeypatch):
    monkeypatch.delenv(EBPF_XDP_ENV, raising=False)
    assert xdp_mode() == "off"
    monkeypatch.setenv(EBPF_XDP_ENV, "")
    assert xdp_mode() == "off"


@pytest.mark.parametrize("mode", ["native", "generic", "off"])
def test_every_mode_is_taken(monkeypatch, mode):
    monkeypatch.setenv(EBPF_XDP_ENV, mode)
    assert xdp_mode() == mode


def test_modes_map_to_the_kernels_flags():
    assert XDP_MODES == {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE, "off": 0}


def test_anything_else_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(EBPF_XDP_ENV, "driver")
    with pytest.raises(ValueError, match="native, generic, off"):
        xdp_mode()
