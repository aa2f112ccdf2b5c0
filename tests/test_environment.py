"""One definition and one table for the environment variables (docs/environment.md): every
`HOMAGG_...` name in product code is a constant of homagg/environment.py, which alone spells
a name as a whole string, and every one of its names is a row of docs/environment.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "homagg" / "environment.py"
TABLE = ROOT / "docs" / "environment.md"
PRODUCT = ("homagg", "run", "bench", "examples")
NAME = re.compile(r"\bHOMAGG_[A-Z0-9_]+\b")


def defined_names(source: str) -> dict[str, str]:
    """The module's constants: constant name -> environment variable, each `X_ENV = "..."`."""
    names: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            (target,) = node.targets
            assert isinstance(target, ast.Name) and isinstance(node.value.value, str)
            names[target.id] = node.value.value
    return names


def string_problems(source: str, defined: set[str], *, home: bool = False) -> list[str]:
    """What a module's string literals (f-strings' parts and docstrings included) do wrong: a
    `HOMAGG_...` name that is not defined, or (outside the home module) a defined name
    spelled as a whole string instead of imported."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        for name in NAME.findall(node.value):
            if name not in defined:
                problems.append(f"line {node.lineno}: {name} is not in homagg/environment.py")
        if not home and node.value in defined:
            problems.append(f"line {node.lineno}: {node.value!r}: import its constant instead")
    return problems


def table_names(markdown: str) -> set[str]:
    """The variables of the table's first column (`| `HOMAGG_X` | ...`)."""
    found = set()
    for line in markdown.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            found.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1]))
    return found


def test_the_module_names_each_variable_once_by_the_convention():
    names = defined_names(MODULE.read_text())
    assert names, "homagg/environment.py defines no name"
    for constant, variable in names.items():
        assert constant.endswith("_ENV") and NAME.fullmatch(variable), (constant, variable)
    assert len(set(names.values())) == len(names), "a variable named twice"


def test_product_code_names_only_defined_variables():
    defined = set(defined_names(MODULE.read_text()).values())
    problems = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text()
            for problem in string_problems(text, defined, home=path == MODULE):
                problems.append(f"{path.relative_to(ROOT)}: {problem}")
    assert not problems, "\n".join(problems)


def test_the_table_lists_every_defined_variable_and_no_other():
    defined = set(defined_names(MODULE.read_text()).values())
    listed = {n for n in table_names(TABLE.read_text()) if n.startswith("HOMAGG_")}
    assert defined - listed == set(), f"missing from docs/environment.md: {defined - listed}"
    assert listed - defined == set(), f"not in homagg/environment.py: {listed - defined}"


def test_the_checks_catch_what_they_are_for():
    defined = {"HOMAGG_A"}
    assert string_problems('X = "HOMAGG_B"', defined)  # an undefined name
    assert string_problems('f"set {x} or $HOMAGG_B"', defined)  # inside an f-string
    assert string_problems('"""Reads HOMAGG_B."""', defined)  # in a docstring
    assert string_problems('os.environ.get("HOMAGG_A")', defined)  # spelled, not imported
    assert not string_problems('os.environ.get("HOMAGG_A")', defined, home=True)
    assert not string_problems('help = "default $HOMAGG_A"', defined)
    assert table_names("| variable |\n|---|\n| `HOMAGG_A` | x |\n") == {"HOMAGG_A"}
    assert table_names("`HOMAGG_B` in prose, not a row\n") == set()
