"""`npudist migrate check|fix` as a user meets it: compact output, formats, --out, and writes that are safe
against links, FIFOs, installed packages and pathological nesting."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
from pathlib import Path

import pytest

from npudist.migrate.files import MAX_NESTING, sources, write
from tests.conftest import run_npudist

SCRIPT = "import torch\nm = model.cuda()\nx = torch.zeros(2).cuda()\ntorch.backends.cudnn.benchmark = True\n"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.subprocess
def test_line_format_is_one_line_per_finding_and_explains_each_rule_once(script: Path) -> None:
    r = run_npudist(["migrate", "check", "--fail-on", "never", str(script)])
    lines = r.stdout.splitlines()
    assert lines[0] == f"{script}:2:5: cuda-method error [fix]: model.cuda()"
    assert lines[3] == f"{script}:3:5: cuda-method error [fix]: torch.zeros(2).cuda()"  # no second explanation
    assert lines[4].startswith(f"{script}:4:1: cuda-backend-flags warning: ")
    assert len(lines) == 3 + 2 * 2 + 1  # 3 findings, 2 rules explained in 2 lines each, the count
    assert lines[-1].startswith("3 finding(s): 2 error, 1 warning")


@pytest.mark.subprocess
def test_csv_and_json_carry_the_same_findings(script: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(run_npudist(["migrate", "check", "--format", "csv", str(script)]).stdout)))
    doc = json.loads(run_npudist(["migrate", "check", "--format", "json", str(script)]).stdout)
    assert [(r["line"], r["rule"]) for r in rows] == [(str(f["line"]), f["rule"]) for f in doc["findings"]] == \
        [("2", "cuda-method"), ("3", "cuda-method"), ("4", "cuda-backend-flags")]
    bad = run_npudist(["migrate", "check", "--format", "xml", str(script)])
    assert bad.returncode == 2 and "--format 'xml'" in bad.stderr


@pytest.mark.subprocess
def test_transfer_to_npu_is_recognised(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_text("import torch\nimport torch_npu\nfrom torch_npu.contrib import transfer_to_npu\nm = model.cuda()\n")
    r = run_npudist(["migrate", "check", "--format", "json", str(path)])
    assert json.loads(r.stdout)["transfer_to_npu"] == [str(path)]
    assert "runs on Ascend by patching" in run_npudist(["migrate", "check", str(path)]).stderr


@pytest.mark.subprocess
def test_out_writes_a_converted_copy_and_a_change_list_leaving_the_source(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "ported"
    r = run_npudist(["migrate", "fix", "--out", str(out), str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert script.read_text() == SCRIPT
    assert "model.to(npudist.accelerator().device())" in (out / "train.py").read_text()
    changes = (out / "CHANGES.txt").read_text().splitlines()
    assert [c.split(":")[0] for c in changes] == ["fixed " + str(script)] * 2 + ["left  " + str(script)]
    assert changes[2].endswith("cuda-backend-flags warning: torch.backends.cudnn.benchmark")


def test_write_keeps_the_mode_and_never_follows_a_planted_link(tmp_path: Path, script: Path) -> None:
    script.chmod(0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    # the old temporary name, and names like mkstemp's: all links to the victim
    for name in (".train.py.npudist-migrate.tmp", ".train.py.x.npudist-migrate"):
        (tmp_path / name).symlink_to(victim)
    write(script, "new\n")
    assert script.read_text() == "new\n" and victim.read_text() == "keep"
    assert stat.S_IMODE(script.stat().st_mode) == 0o700 and not script.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink()) == ["train.py", "victim.txt"]


@pytest.mark.subprocess
def test_fifos_installed_packages_and_deep_nesting_are_skipped_with_the_reason(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.py")
    venv = tmp_path / "env"  # a venv not named venv: found by its pyvenv.cfg
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / "pkg.py").write_text("import torch\nx.cuda()\n")
    site = tmp_path / "vendor"
    (site / "torch_thing-1.0.dist-info").mkdir(parents=True)
    (site / "mod.py").write_text("x.cuda()\n")
    (tmp_path / "deep.py").write_text("x = " + "(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1) + "\n")
    seen = {s.path.name: s.skipped for s in sources([tmp_path])}
    assert set(seen) == {"pipe.py", "deep.py"}  # the venv and site-packages are not entered
    assert seen["pipe.py"].startswith("not a regular file")
    assert "nested more than" in seen["deep.py"]
    entered = {s.path.name for s in sources([tmp_path], include_installed=True)}
    assert {"pkg.py", "mod.py"} <= entered
    r = run_npudist(["migrate", "fix", "--write", str(venv)], timeout=60)
    assert "virtual environment (pyvenv.cfg); pass --include-installed" in r.stderr
    assert (venv / "lib" / "pkg.py").read_text() == "import torch\nx.cuda()\n"


@pytest.mark.subprocess
def test_three_thousand_nested_brackets_are_refused_not_crashed(tmp_path: Path) -> None:
    deep = tmp_path / "deep.py"
    deep.write_text("x = " + "(" * 3000 + "1" + ")" * 3000 + "\n")
    good = tmp_path / "good.py"
    good.write_text("import torch\nm = model.cuda()\n")
    r = run_npudist(["migrate", "fix", "--write", str(tmp_path)], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "deep.py: skipped: brackets nested more than 100 deep" in r.stderr
    assert "npudist" in good.read_text()
