"""The tests' small helpers are written once (tests/conftest.py) and imported, not copied per module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ONE_PLACE = {"free_port": TESTS / "conftest.py", "free_ports": TESTS / "conftest.py"}


def _definitions(name: str) -> list[str]:
    """Files under tests/ that define ``name`` or ``_name`` (or a ``_free_base``/``free_pair`` variant)."""
    spellings = {name, f"_{name}"} | ({"_free_base", "free_pair"} if name == "free_ports" else set())
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name in spellings for node in ast.walk(tree)):
            found.append(str(path.relative_to(TESTS)))
    return found


@pytest.mark.parametrize("name", sorted(ONE_PLACE))
def test_a_helper_is_defined_once_and_imported_elsewhere(name):
    assert _definitions(name) == [str(ONE_PLACE[name].relative_to(TESTS))]
