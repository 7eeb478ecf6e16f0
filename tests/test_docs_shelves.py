"""The manual stays findable: every page sits on a shelf and is listed in docs/README.md, which the README links;
docs/architecture.md names every package of src/npudist, and no package that is gone."""

from __future__ import annotations

import re

from tests.conftest import REPO, SRC

DOCS = REPO / "docs"
INDEX = DOCS / "README.md"
ARCHITECTURE = DOCS / "architecture.md"
SHELVES = ("guide", "reference", "engineering")
# Pages kept at the top of docs/: the index, the map of the code, and the runbook, whose address every exported
# alert rule carries as its runbook_url (moving it would break an on-call's links).
TOP = {"README.md", "architecture.md", "runbook.md"}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def _linked(page) -> set:
    return {(page.parent / target).resolve() for target in LINK.findall(page.read_text())
            if not re.match(r"[a-z]+:", target)}


def _packages() -> set[str]:
    """Every importable package under src/npudist, as its path there ("comm/hang"): a folder with __init__.py
    whose parent is a package too (sim/stand_in/torch_npu is a stand-in for another project, not npudist's)."""
    root = SRC / "npudist"
    found = set()
    for init in root.rglob("__init__.py"):
        parts = init.parent.relative_to(root).parts
        if parts and all((root.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))):
            found.add("/".join(parts))
    return found


def test_every_page_sits_on_a_shelf():
    pages = [p.relative_to(DOCS) for p in DOCS.rglob("*.md")]
    loose = [str(p) for p in pages if (p.name not in TOP if len(p.parts) == 1 else p.parts[0] not in SHELVES)]
    assert not loose, f"put these pages on a shelf ({', '.join(SHELVES)}): {loose}"


def test_the_index_lists_every_page_and_the_readme_links_the_index():
    listed = _linked(INDEX)
    missing = [str(p.relative_to(DOCS)) for p in sorted(DOCS.rglob("*.md")) if p != INDEX and p.resolve() not in listed]
    assert not missing, f"docs/README.md does not list: {missing}"
    assert {INDEX.resolve(), ARCHITECTURE.resolve()} <= _linked(REPO / "README.md")


def test_the_architecture_page_names_every_package():
    text = ARCHITECTURE.read_text()
    unnamed = sorted(p for p in _packages() if not re.search(rf"(?<![\w/]){re.escape(p)}/", text))
    assert not unnamed, f"docs/architecture.md does not name: {unnamed} (add a row to 'What each package owns')"


def test_the_architecture_table_names_no_package_that_is_gone():
    text = ARCHITECTURE.read_text()
    table = text.split("## What each package owns", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w/]+)/` \|", table, re.M)
    assert len(rows) >= 10, "the table of packages moved; update this test with it"
    gone = [r for r in rows if not (SRC / "npudist" / r / "__init__.py").exists()]
    assert not gone, f"docs/architecture.md describes packages that are not in src/npudist: {gone}"


def test_the_package_finder_sees_nested_packages_and_skips_stand_ins():
    found = _packages()
    assert {"comm", "telemetry/sources/npu_smi"} <= found
    assert not [p for p in found if p.startswith("sim/stand_in")]
