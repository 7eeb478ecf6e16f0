"""The README is a front page and docs/ the manual: every relative link in them resolves, the README stays a
page (<= 200 lines), and every `npudist ...` line in its code blocks names a real command and real options."""

from __future__ import annotations

import re
import shlex

import pytest
import typer

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = page.read_text()
    for block in _code_blocks(text):
        text = text.replace(block, "")
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    assert not re.search(r"^#+ .*\bissue \d+", text, re.M | re.I)


def _resolve(words: list[str]):
    from npudist.cli import app

    ctx_group = typer.main.get_command(app)
    cmd, path = ctx_group, []
    with typer.Context(ctx_group) as ctx:
        while words and hasattr(cmd, "resolve_command") and not words[0].startswith("-"):
            _, cmd, _ = cmd.resolve_command(ctx, [words[0]])
            path.append(words.pop(0))
            ctx = typer.Context(cmd, parent=ctx)
    return cmd, path


def _readme_commands() -> list[str]:
    lines = []
    for block in _code_blocks((REPO / "README.md").read_text()):
        lines += [line.split("#", 1)[0].strip() for line in block.splitlines()
                  if line.strip().startswith("npudist ")]
    return lines


@pytest.mark.parametrize("line", _readme_commands())
def test_every_readme_command_is_real(line):
    words = shlex.split(line)[1:]
    cmd, path = _resolve(list(words))
    assert path and not hasattr(cmd, "resolve_command"), f"{line}: {path} is not a command"
    if path == ["launch"]:  # the rest is torchrun's and npudist's launch options (launch.parser())
        from npudist import launch

        known = {o for a in launch.parser()._actions for o in a.option_strings}
    else:
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for word in words[len(path):]:
        if word.startswith("--"):
            assert word.split("=", 1)[0] in known, f"{line}: {word} is not an option of npudist {' '.join(path)}"
