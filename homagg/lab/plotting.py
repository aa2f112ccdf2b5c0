"""matplotlib for the run's and the benchmarks' plots: the one place that imports it.

The project's virtual environment sees Debian's packages (`--system-site-packages`, for
Mininet), and Debian's python3-matplotlib installs a `matplotlib-*-nspkg.pth` that imports
`mpl_toolkits` at every interpreter's start with Debian's directory as its path: the
matplotlib the environment installed then imports Debian's older `mpl_toolkits.mplot3d`,
which fails against it, and warns "Unable to import Axes3D" on every import. pyplot() puts
the `mpl_toolkits` installed beside the matplotlib being imported first on that path."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any


def pin_mpl_toolkits() -> bool:
    """Resolve `mpl_toolkits.*` to the copy beside matplotlib's own installation first (when it
    has one and no toolkit was imported yet); True when that is so."""
    found = importlib.util.find_spec("matplotlib")
    if found is None or found.origin is None:
        return False
    own = str(Path(found.origin).parent.parent / "mpl_toolkits")
    if not Path(own, "mplot3d").is_dir():
        return False
    toolkits = sys.modules.get("mpl_toolkits")
    if toolkits is None:
        spec = importlib.machinery.ModuleSpec("mpl_toolkits", None, is_package=True)
        spec.submodule_search_locations = [own]
        sys.modules["mpl_toolkits"] = importlib.util.module_from_spec(spec)
        return True
    path = list(getattr(toolkits, "__path__", []))
    if path[:1] == [own]:
        return True
    if any(name.startswith("mpl_toolkits.") for name in sys.modules):
        return False  # a toolkit is already imported from elsewhere: too late to change
    toolkits.__path__ = [own, *(p for p in path if p != own)]
    return True


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (no display on these machines)."""
    pin_mpl_toolkits()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
