"""The switch command lines: ports, addresses and log levels (BMv2's default level costs
half its packet rate, so it must be set)."""

from __future__ import annotations

import pytest

from testnet.switch_process import switch_command


def test_bmv2_command_sets_a_quiet_log_level_and_its_ports():
    cmd = switch_command("bmv2", {2: "veth-b", 1: "veth-a"}, 9559)
    assert cmd[:5] == ["simple_switch_grpc", "-i", "1@veth-a", "-i", "2@veth-b"]
    assert cmd[cmd.index("--log-level") + 1] == "warn" and "--log-console" in cmd
    assert cmd[cmd.index("--") + 1 :] == ["--grpc-server-addr", "127.0.0.1:9559"]
    debug = switch_command("bmv2", {}, 9559, log_level="debug")
    assert debug[debug.index("--log-level") + 1] == "debug"


def test_refswitch_command_and_unknown_target():
    cmd = switch_command("refswitch", {1: "a"}, 9560, device_id=3)
    assert cmd[1:3] == ["-m", "refswitch"] and cmd[cmd.index("--log-level") + 1] == "info"
    assert cmd[cmd.index("--device-id") + 1] == "3"
    with pytest.raises(ValueError, match="unknown switch target"):
        switch_command("tofino", {}, 1)
