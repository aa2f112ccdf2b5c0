"""Two shortened `make run`s at once (conftest.py's auto_runs: 2 hosts each, refswitch,
the MLP for 12 steps) both finish: every name, address and directory is per run
(run/names.py), and each cleans up only its own."""

from __future__ import annotations

import pytest
from mininet_runs import mininet_reason, run_number

pytestmark = pytest.mark.skipif(
    bool(mininet_reason()), reason=mininet_reason() or "runs make run in Mininet"
)


@pytest.mark.timeout(420)
def test_two_runs_at_once_both_finish_and_clean_up(auto_runs):
    runs = [auto_runs["auto"], auto_runs["auto-dear"]]  # (a third ran beside them)
    outputs = [run.output() for run in runs]
    assert len(outputs) == 2
    for out in outputs:
        assert "[switch] step   12/12" in out, out[-2000:]
    numbers = [run_number(out) for out in outputs]
    assert None not in numbers and numbers[0] != numbers[1]
    # each cleaned up (looked at as the runs ended): interfaces, state file, processes
    assert [run.left for run in runs] == [(), ()]
