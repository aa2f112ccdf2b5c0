"""Fixtures of the fault tests: the report of injected faults and retransmissions, printed
at the end of the run (the issue asks for retransmissions to be counted and reported)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Shared helpers of other suites (their directories are on sys.path only when collected).
for d in (HERE, HERE.parent / "control"):
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))

REPORT: list[str] = []


@pytest.fixture
def fault_report(request: pytest.FixtureRequest):
    """report(line): adds a line under the test's id to the end-of-run fault report."""

    def report(line: str) -> None:
        REPORT.append(f"{request.node.nodeid}: {line}")

    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if REPORT:
        terminalreporter.section("faults injected and retransmissions")
        for line in REPORT:
            terminalreporter.write_line(line)
