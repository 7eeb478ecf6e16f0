"""A torch built against numpy 1.x beside numpy 2 is named with the fix, in the doctor and in launch, instead
of the ranks' `RuntimeError: Numpy is not available`."""

from __future__ import annotations

import pytest

from npudist.doctor import checks
from npudist.doctor.host import Host
from npudist.runtime import numpy_torch
from tests.conftest import child_env, run_npudist


@pytest.mark.parametrize(("torch_v", "numpy_v", "wrong"), [
    ("2.1.2", "2.4.6", True), ("2.2.2+cpu", "2.0.0", True), ("2.1.0.post3", "2.1.0", True),
    ("2.1.2", "1.26.4", False), ("2.3.0", "2.0.0", False), ("2.13.0+cpu", "2.4.6", False),
    (None, "2.4.6", False), ("2.1.2", None, False)])
def test_only_an_old_torch_with_numpy_2_is_a_mismatch(torch_v, numpy_v, wrong):
    found = numpy_torch.mismatch(torch_v, numpy_v)
    assert (found is not None) is wrong
    if wrong:
        assert f"numpy {numpy_v}" in found and f"torch {torch_v}" in found and 'pip install "numpy<2"' in found


def _installed(monkeypatch, versions: dict[str, str | None]) -> None:
    monkeypatch.setattr(numpy_torch, "installed", versions.get)


def test_the_doctor_fails_the_pair_with_the_fix(monkeypatch):
    _installed(monkeypatch, {"torch": "2.1.2", "numpy": "2.4.6"})
    got = checks.numpy_pair(Host(env={}))
    assert got.status == "fail" and "Numpy is not available" in got.finding and got.fix.startswith("pip install")
    _installed(monkeypatch, {"torch": "2.1.2", "numpy": "1.26.4"})
    assert checks.numpy_pair(Host(env={})).status == "ok"
    _installed(monkeypatch, {"torch": "2.1.2"})
    assert checks.numpy_pair(Host(env={})).status == "warn"


@pytest.mark.subprocess
def test_launch_names_the_mismatch_before_the_ranks_start(tmp_path):
    """An installed torch 2.1.2 is stood in for by its metadata first on the path (the import is this torch)."""
    meta = tmp_path / "torch-2.1.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.1.2\n")
    env = child_env(pythonpath=[tmp_path])
    done = run_npudist(["launch", str(tmp_path / "missing.py")], env=env, timeout=120)
    text = " ".join(done.stderr.split())
    assert 'npudist launch: warning: numpy' in text and 'pip install "numpy<2"' in text, done.stderr
    assert "torch 2.1.2" in text
