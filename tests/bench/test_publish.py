"""bench/publish.py: every result's first line names what it measured, the machine and day."""

import os
import platform
import re

from bench.publish import heading


def test_heading_names_the_machine_the_day_and_the_extras():
    line = heading("Switch packet rate", "torch 2.13.0")
    assert line.startswith(f"# Switch packet rate ({platform.machine()}, {os.cpu_count()} cores, ")
    assert re.search(r", \d{4}-\d{2}-\d{2}, torch 2\.13\.0\)$", line), line
