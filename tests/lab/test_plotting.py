"""matplotlib imports without the "Unable to import Axes3D" warning in the project's
environment, which also sees Debian's matplotlib (homagg/lab/plotting.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
from homagg.lab.plotting import pyplot
plt = pyplot()
from matplotlib.projections import get_projection_names
assert "3d" in get_projection_names(), get_projection_names()
"""


def test_pyplot_imports_without_the_axes3d_warning_and_has_the_3d_projection():
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
