"""The README's Layout section names every package and top-level module of src/npudist, and nothing gone."""

from __future__ import annotations

import re

from tests.conftest import REPO, SRC


def _layout_block() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Layout")
    return text[text.index("```", start) + 3:text.index("```", text.index("```", start) + 3)]


def test_layout_lists_the_tree():
    block = _layout_block()
    named = set(re.findall(r"^(src/npudist/\S+)", block, re.M))
    pkg = SRC / "npudist"
    expected = {f"src/npudist/{p.name}/" for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                and p.name != "telemetry"}
    expected |= {f"src/npudist/telemetry/{p.name}/" for p in (pkg / "telemetry").iterdir()
                 if p.is_dir() and (p / "__init__.py").exists()}
    expected |= {f"src/npudist/{p.name}" for p in pkg.glob("*.py") if p.name != "__init__.py"}
    assert named == expected
    # telemetry/ holds role folders, and beside them only the run log's format, which its writer (job/) and its
    # reader (report/) share (issue 48's layout).
    loose = sorted(p.name for p in (pkg / "telemetry").glob("[!_]*.py"))
    assert loose == ["runlog_schema.py"], f"telemetry/ holds role folders only: {loose}"
