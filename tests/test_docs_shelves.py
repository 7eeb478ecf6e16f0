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


def test_a_newcomer_finds_every_page_from_the_readme_in_one_click():
    """The README's manual table links every page itself (issue 48: 'finds any page from it in one click')."""
    linked = _linked(REPO / "README.md")
    missing = [str(p.relative_to(DOCS)) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in linked]
    assert not missing, f"the README's manual does not link: {missing}"


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


def test_the_settings_page_names_every_variable_npudist_reads():
    """Every "NPUDIST_..." string in the code is a variable someone may meet: the settings page names each (as a
    setting, or under "Not settings")."""
    text = (DOCS / "reference" / "settings.md").read_text()
    read = {m for p in (SRC / "npudist").rglob("*.py") for m in re.findall(r"[\"'`](NPUDIST_[A-Z0-9_]*[A-Z0-9])\b",
                                                                            p.read_text())}
    assert len(read) >= 20, "the variable finder finds too little; update this test"
    missing = sorted(v for v in read if f"`{v}`" not in text)
    assert not missing, f"docs/reference/settings.md does not name: {missing}"


def _commands() -> list[str]:
    """Every command line `npudist X [Y]` can run, the lazily loaded groups (bench, deploy) resolved too."""
    import typer

    from npudist.cli import app

    root = typer.main.get_command(app)
    found = []
    with typer.Context(root) as ctx:
        for name in root.list_commands(ctx):
            _, cmd, _ = root.resolve_command(ctx, [name])
            sub = typer.Context(cmd, parent=ctx)
            subs = cmd.list_commands(sub) if hasattr(cmd, "list_commands") else []
            found += [f"npudist {name} {s}" for s in subs] or [f"npudist {name}"]
    return found


def test_the_commands_page_names_every_command():
    text = (DOCS / "reference" / "commands.md").read_text()
    commands = _commands()
    assert {"npudist launch", "npudist bench collective", "npudist deploy slurm"} <= set(commands)
    missing = [c for c in commands if not re.search(rf"`{re.escape(c)}[` ]", text)]
    assert not missing, f"docs/reference/commands.md does not name: {missing}"


def test_the_commands_page_names_every_option_npudist_adds_to_torchrun():
    from torch.distributed.run import get_args_parser

    from npudist import launch

    torchrun = {o for a in get_args_parser()._actions for o in a.option_strings}
    ours = [a.option_strings[0] for a in launch.parser()._actions if a.option_strings
            and not set(a.option_strings) & torchrun and a.option_strings[0].startswith("--")]
    assert "--metrics-port" in ours
    text = (DOCS / "reference" / "commands.md").read_text()
    missing = [o for o in ours if not re.search(rf"`{re.escape(o)}[` =\[]", text)]
    assert not missing, f"docs/reference/commands.md does not name launch's {missing}"
