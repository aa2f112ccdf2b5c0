"""The package layout (README, "What it is"): one installed package, `homagg`; nothing outside
tests imports test code; `import homagg` and the command-line entry points import no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_DIRS = ("homagg", "run", "bench", "examples", "docker")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_homagg_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(str(ROOT), include=include)
    assert found, "no package found"
    assert {p.split(".")[0] for p in found} == {"homagg"}
    for script in config["project"]["scripts"].values():
        assert script.startswith("homagg."), script


def test_every_package_directory_is_a_package():
    """A directory of modules without __init__.py would be left out of the wheel."""
    for d in (ROOT / "homagg").rglob("*"):
        if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts:
            assert (d / "__init__.py").is_file(), f"{d.relative_to(ROOT)} has no __init__.py"


@pytest.mark.parametrize("top", PRODUCT_DIRS)
def test_no_product_module_imports_test_code(top):
    for path in (ROOT / top).rglob("*.py"):
        if "gen" in path.relative_to(ROOT).parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        bad = {m for m in _imported_modules(path) if m == "tests" or m.startswith("tests.")}
        assert not bad, f"{path.relative_to(ROOT)} imports test code: {sorted(bad)}"


@pytest.mark.parametrize(
    "module",
    ["homagg", "homagg.control.cli", "homagg.refswitch.cli", "homagg.worker.job.launch"],
)
def test_entry_points_start_without_torch(module):
    """The controller, the switch and homagg-run start in a fraction of torch's import time."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"importing {module} imported torch"


def test_the_backend_is_registered_whichever_is_imported_first():
    for order in ("import homagg, torch.distributed as d", "import torch.distributed as d, homagg"):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                # the loader homagg wraps keeps the rest of its interface
                f"{order}; print('homagg' in d.Backend.backend_list"
                " and d.__loader__.is_package('torch.distributed'))",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "True", order


def test_test_module_names_are_unique():
    """pytest's default import mode imports each test module by its bare name: two files of
    one name in different test folders stop the whole suite's collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in names.items() if len(p) > 1}
