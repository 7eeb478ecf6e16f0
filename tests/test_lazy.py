"""The one lazy-export helper (npudist._lazy): loads on first use, caches, lists, and is the only one."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path
from types import MappingProxyType

import pytest

from npudist._lazy import exports, listing

SRC = Path(__file__).resolve().parents[1] / "src" / "npudist"
# The simulated torch_npu answers every unknown name with NotSimulated: a stand-in, not a lazy export.
NOT_EXPORTS = {SRC / "sim" / "stand_in" / "torch_npu" / "__init__.py"}


@pytest.fixture
def package(monkeypatch):
    """An empty package ``lazy_probe`` whose names come from the standard library."""
    module = types.ModuleType("lazy_probe")
    monkeypatch.setitem(sys.modules, "lazy_probe", module)
    where = MappingProxyType({"dumps": "json", "sep": ("os", "sep")})
    module.__getattr__ = exports("lazy_probe", where, submodules=("tool",))
    module.__dir__ = listing("lazy_probe", where, submodules=("tool",))
    return module


def test_a_name_loads_on_first_use_and_is_then_a_plain_attribute(package):
    import json

    assert "dumps" not in vars(package)
    assert package.dumps is json.dumps
    assert vars(package)["dumps"] is json.dumps  # cached: the next lookup does not come back to __getattr__


def test_a_public_name_may_differ_from_the_attribute_it_names(package):
    import os

    assert package.sep == os.sep


def test_a_submodule_is_imported_under_the_package(package, monkeypatch):
    tool = types.ModuleType("lazy_probe.tool")
    monkeypatch.setitem(sys.modules, "lazy_probe.tool", tool)
    assert package.tool is tool


def test_an_unknown_name_is_an_attribute_error_naming_the_package(package):
    with pytest.raises(AttributeError, match=r"module 'lazy_probe' has no attribute 'nope'"):
        package.nope  # noqa: B018


def test_dir_lists_names_not_loaded_yet(package):
    assert {"dumps", "sep", "tool"} <= set(dir(package))
    assert "dumps" not in vars(package)


def _defines_getattr(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body)


def test_no_package_hand_rolls_its_own_module_getattr():
    hand_rolled = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py"))
                   if p not in NOT_EXPORTS and _defines_getattr(p)]
    assert hand_rolled == [], f"use npudist._lazy.exports instead of a module-level __getattr__ in {hand_rolled}"


@pytest.mark.parametrize("name", ["npudist", "npudist.runtime", "npudist.accelerators", "npudist.migrate",
                                  "npudist.ops"])
def test_every_public_name_of_a_lazy_package_resolves(name):
    package = importlib.import_module(name)
    missing = [n for n in package.__all__ if not hasattr(package, n)]
    assert missing == []
    assert set(package.__all__) <= set(dir(package))
