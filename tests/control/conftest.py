"""Fixtures of the controller tests (helpers in ctl_helpers.py): a switch of each target, an
in-process controller managing it, and backup P4Runtime sessions that read the switch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import TARGETS, RunningController, SwitchUnderTest, make_config

from homagg.control.config import ControllerConfig
from homagg.control.switch_connection import SwitchConnection


@pytest.fixture(scope="module", params=TARGETS)
def shared_switch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SwitchUnderTest]:
    """One switch of each target kind per test module (starting BMv2 and pushing it the
    pipeline takes a second, so tests share it)."""
    sw = SwitchUnderTest(request.param, tmp_path_factory.mktemp(f"switch-{request.param}"))
    yield sw
    sw.stop()


@pytest.fixture
def switch(shared_switch: SwitchUnderTest) -> SwitchUnderTest:
    """The module's switch, running and emptied of what an earlier test's controller installed
    (a new controller's new database would refuse a switch holding jobs it has no record of)."""
    if not shared_switch.running:
        shared_switch.start()
    shared_switch.clear()
    return shared_switch


@pytest.fixture
def refswitch(tmp_path: Path) -> Iterator[SwitchUnderTest]:
    """A fresh reference switch (for tests that look inside the device)."""
    sw = SwitchUnderTest("refswitch", tmp_path)
    yield sw
    sw.stop()


@pytest.fixture
def start_controller() -> Iterator[Callable[[ControllerConfig], RunningController]]:
    """Starts in-process controllers (synced with their switches); stops them all afterwards."""
    running: list[RunningController] = []

    def start(config: ControllerConfig, sync: bool = True, **client: Any) -> RunningController:
        ctl = RunningController(config, **client)
        running.append(ctl)
        if sync:
            ctl.wait_synced()
        return ctl

    yield start
    for ctl in running:
        ctl.stop()


@pytest.fixture
def controller(
    switch: SwitchUnderTest, tmp_path: Path, start_controller: Callable[..., RunningController]
) -> RunningController:
    """A controller managing `switch` as s1."""
    return start_controller(make_config(switch.address, tmp_path))


@pytest.fixture
def reader(switch: SwitchUnderTest) -> Iterator[Callable[[], SwitchConnection]]:
    """A backup P4Runtime session to `switch` (election ids below the controller's 10), reopened
    after the switch restarted."""
    opened: list[SwitchConnection] = []

    def session() -> SwitchConnection:
        if opened and opened[-1].is_connected:
            return opened[-1]
        conn = SwitchConnection(switch.address, election_id=len(opened) % 9 + 1, timeout=3.0)
        conn.connect(require_primary=False)
        opened.append(conn)
        return conn

    yield session
    for conn in opened:
        conn.close()
