"""The tree fabric's own bookkeeping: a tree whose switches cannot start leaves no namespace
or link behind (the packet tests in tests/packet/test_tree.py use a working one)."""

from __future__ import annotations

import pytest

from homagg.environment import BMV2_OPT_ENV
from homagg.lab.fabric import TAG_PATTERN
from homagg.lab.namespace import have_privileges, ip
from homagg.lab.tree_fabric import TreeFabric


def our_names() -> set[str]:
    """Namespaces and links of this machine that carry a fabric tag."""
    links = {
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show").stdout.splitlines()
    }
    namespaces = {line.split()[0] for line in ip("netns", "list").stdout.splitlines()}
    return {n for n in links | namespaces if TAG_PATTERN.match(n)}


@pytest.mark.skipif(not have_privileges(), reason="needs root (namespaces and veth links)")
def test_a_tree_that_fails_to_start_removes_what_it_made(monkeypatch, tmp_path):
    monkeypatch.delenv(BMV2_OPT_ENV, raising=False)  # bmv2-opt cannot start without it
    before = our_names()
    with pytest.raises(RuntimeError, match="bmv2-opt needs"):
        TreeFabric("bmv2-opt", 2, 1, tmp_path)
    assert our_names() <= before
