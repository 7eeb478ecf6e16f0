"""Help answers without importing torch (torchrun's and accelerate's help take under a second; torch's import
alone takes seconds). Measured as import work, not wall time: torch must not be in sys.modules after the
help page is built, and the page must be the real one."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import child_env

# Every page in one child: one start of Python and npudist instead of one per page (36 pages: 3 s instead of
# 40 s; the pages are the ones a process per page builds). torch stays in sys.modules once a page imports it,
# so the first page with "torch" true is the one that imported it.
PROBE = """
import contextlib, io, json, sys
from npudist.__main__ import main
pages = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["npudist", *argv]
    out = io.StringIO()
    code = None
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as exc:
            code = exc.code
    pages.append({"code": code, "torch": "torch" in sys.modules, "page": out.getvalue()})
print(json.dumps(pages))
"""

FAST = [["--help"], [], ["--version"], ["doctor", "--help"], ["test", "--help"], ["exporter", "--help"],
        ["report", "--help"],
        ["observe", "--help"], ["diagnose", "--help"], ["dashboards", "--help"], ["dashboards", "export", "--help"],
        ["migrate", "--help"],
        ["migrate", "check", "--help"], ["edge", "--help"], ["edge", "convert", "--help"],
        ["launch", "--help"], ["bench", "--help"], ["bench", "collective", "--help"], ["deploy", "--help"],
        ["deploy", "k8s", "--help"], ["deploy", "slurm", "--help"], ["ranktable", "--help"],
        ["ranktable", "check", "--help"]]


@pytest.fixture(scope="module")
def pages() -> dict[str, dict]:
    """Each help page this file reads, by its command line, with its exit code and whether torch was imported."""
    # each page once, in FAST's order: a second build of a page comes after every page before it
    wanted = [list(argv) for argv in dict.fromkeys(map(tuple, FAST + [[*a, "--help"] for a in WITH_EXAMPLES]))]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(wanted)], capture_output=True, text=True,
                          timeout=300, env=child_env({"COLUMNS": "200"}))
    assert done.returncode == 0, done.stderr[-2000:]
    return {" ".join(argv): got for argv, got in zip(wanted, json.loads(done.stdout.strip().splitlines()[-1]),
                                                     strict=True)}


@pytest.mark.subprocess
@pytest.mark.parametrize("argv", FAST, ids=" ".join)
def test_help_is_answered_without_importing_torch(argv, pages):
    got = pages[" ".join(argv)]
    first = next((line for line, page in pages.items() if page["torch"]), None)
    assert got["code"] in (0, 2, None) and not got["torch"], f"{first!r} imported torch: {got}"
    assert ("npudist" in got["page"]) and ("usage" in got["page"].lower() or got["page"].startswith("npudist "))


@pytest.mark.subprocess
def test_the_top_level_page_lists_every_command_with_its_help(pages):
    page = pages["--help"]["page"]
    for name in ("launch", "doctor", "test", "exporter", "report", "diagnose", "observe", "dashboards", "migrate",
                 "edge", "bench", "deploy"):
        assert f" {name} " in page, name
    assert "npudist bench collective --help" in page and "npudist deploy k8s|slurm --help" in page
    assert "[npudist options] [torchrun options] SCRIPT [ARGS]" in page  # not eaten as rich markup


@pytest.mark.subprocess
def test_the_lazy_commands_still_run(pages):
    got = pages["deploy k8s --help"]
    assert got["code"] in (0, None) and "--namespace" in got["page"]


@pytest.mark.subprocess
def test_launch_help_lists_npudists_options_then_torchruns_without_torch(pages):
    page = pages["launch --help"]["page"]
    assert page.index("--metrics-port") < page.index("--nnodes") and "--rdzv-backend" in page


def test_torchrun_parser_read_from_source_is_torchruns_own():
    """The parser compiled from torch/distributed/run.py answers as torch's import of it does (env fallbacks
    included: PET_NNODES is read by argparse_util's env action)."""
    from torch.distributed.run import get_args_parser

    from npudist.launch.torchrun_parser import _from_source

    ours, theirs = _from_source(), get_args_parser()
    assert ours.format_help() == theirs.format_help()
    argv = ["--nnodes", "2", "--rdzv-id", "j1", "--standalone", "train.py", "--lr", "1"]
    assert vars(ours.parse_args(argv)) == vars(theirs.parse_args(argv))


@pytest.mark.parametrize(("argv", "only"), [(["launch", "--help"], True), (["launch", "train.py", "--help"], False),
                                            (["launch", "--nnodes", "2", "-h"], False), (["bench", "--help"], True)])
def test_help_after_the_launched_script_belongs_to_the_script(argv, only):
    from npudist.__main__ import help_only

    assert help_only(argv) is only


LAZY = """
import importlib, json, pkgutil, sys, types
pkg = importlib.import_module(sys.argv[1])
for sub in pkgutil.iter_modules(pkg.__path__):
    importlib.import_module(f"{pkg.__name__}.{sub.name}")  # the import system binds each submodule on pkg
print(json.dumps({n: type(getattr(pkg, n)).__name__ for n in pkg.__all__
                  if isinstance(getattr(pkg, n), types.ModuleType)}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("package", ["npudist.telemetry", "npudist.edge", "npudist.accelerators"])
def test_a_lazily_exported_name_is_never_shadowed_by_a_submodule(package):
    # A name loaded on first use must not share its name with a submodule: once anything imports that
    # submodule, the package attribute is the module and `from pkg import name` returns it.
    done = subprocess.run([sys.executable, "-c", LAZY, package], capture_output=True, text=True, timeout=120,
                          env=child_env({}))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}


WITH_EXAMPLES = [["doctor"], ["test"], ["exporter"], ["report"], ["diagnose"], ["observe"], ["dashboards", "export"],
                 ["dashboards", "check"], ["bench", "collective"], ["edge", "convert"], ["launch"],
                 ["deploy", "slurm"], ["deploy", "k8s"]]


@pytest.mark.subprocess
@pytest.mark.parametrize("argv", WITH_EXAMPLES, ids=" ".join)
def test_a_help_page_shows_an_example_of_its_command(argv, pages):
    page = " ".join(pages[" ".join([*argv, "--help"])]["page"].replace("│", " ").split())
    found = re.search(r"examples?:(.*)", page, re.IGNORECASE)
    assert found and f"npudist {' '.join(argv)} " in found.group(1), page[-800:]
