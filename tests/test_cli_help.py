"""Help answers without importing torch (torchrun's and accelerate's help take under a second; torch's import
alone takes seconds). Measured as import work, not wall time: torch must not be in sys.modules after the
help page is built, and the page must be the real one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import child_env

PROBE = """
import contextlib, io, json, sys
sys.argv = ["npudist", *json.loads(sys.argv[1])]
from npudist.__main__ import main
out = io.StringIO()
code = None
with contextlib.redirect_stdout(out):
    try:
        main()
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "page": out.getvalue()}))
"""

FAST = [["--help"], [], ["--version"], ["doctor", "--help"], ["exporter", "--help"], ["report", "--help"],
        ["observe", "--help"], ["dashboards", "--help"], ["dashboards", "export", "--help"], ["migrate", "--help"],
        ["migrate", "check", "--help"], ["edge", "--help"], ["edge", "convert", "--help"]]


def _help(argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=120, env=child_env({"COLUMNS": "200"}))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", FAST, ids=" ".join)
def test_help_is_answered_without_importing_torch(argv):
    got = _help(argv)
    assert got["code"] in (0, 2, None) and not got["torch"], got
    assert ("npudist" in got["page"]) and ("Usage" in got["page"] or got["page"].startswith("npudist "))


def test_the_top_level_page_lists_every_command_with_its_help():
    page = _help(["--help"])["page"]
    for name in ("launch", "doctor", "exporter", "report", "observe", "dashboards", "migrate", "edge", "bench",
                 "deploy"):
        assert f" {name} " in page, name
    assert "npudist bench collective --help" in page and "npudist deploy k8s|slurm --help" in page
    assert "[npudist options] [torchrun options] SCRIPT [ARGS]" in page  # not eaten as rich markup


def test_the_lazy_commands_still_run():
    got = _help(["deploy", "k8s", "--help"])
    assert got["code"] in (0, None) and "--namespace" in got["page"]
