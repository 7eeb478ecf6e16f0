"""A device extension that breaks `import torch`: parsed, explained, and survived by the CLI.

The subprocess cases install a stand-in extension through torch's own plugin mechanism (a
``torch.backends`` entry point, as torch_npu registers), so the real autoload path in torch raises.
tests/vendor/ does the same against the released torch-npu wheel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npudist.accelerators import backend_guard
from tests.conftest import child_env, run_npudist, run_py

TORCH_MESSAGE = ("Failed to load the backend extension: torch_npu. You can disable extension auto-loading "
                 "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")


def test_parse_failure_names_extension_and_cause():
    try:
        try:
            raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
        except ImportError as inner:
            raise RuntimeError(TORCH_MESSAGE) from inner
    except RuntimeError as exc:
        broken = backend_guard.parse_failure(exc)
    assert broken == backend_guard.BrokenBackend(
        "torch_npu", "ImportError: libhccl.so: cannot open shared object file: No such file or directory")
    assert backend_guard.parse_failure(RuntimeError("CUDA error: out of memory")) is None


def test_marker_round_trip_and_garbled_values_are_ignored():
    broken = backend_guard.BrokenBackend("torch_npu", "ImportError: libhccl.so")
    assert backend_guard.from_env({backend_guard.MARKER_VAR: broken.to_env()}) == broken
    for garbled in ("", "not json", "[1, 2]", '{"extension": "x"}'):
        assert backend_guard.from_env({backend_guard.MARKER_VAR: garbled}) is None


def test_explanation_uses_the_vendor_rows_fix():
    text = backend_guard.explain(backend_guard.BrokenBackend("torch_npu", "ImportError: libhccl.so"))
    assert "set_env.sh" in text and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in text and "libhccl.so" in text
    generic = backend_guard.explain(backend_guard.BrokenBackend("torch_acme", "OSError: nope"))
    assert "install or configure the runtime that torch_acme needs" in generic


@pytest.fixture
def broken_plugin(tmp_path: Path) -> dict[str, str]:
    """A `torch_acme` device extension whose import fails on a missing shared library."""
    (tmp_path / "torch_acme").mkdir()
    (tmp_path / "torch_acme" / "__init__.py").write_text(
        "raise ImportError('libacme.so: cannot open shared object file: No such file or directory')\n")
    info = tmp_path / "torch_acme-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_acme\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_acme = torch_acme:_autoload\n")
    return child_env(pythonpath=[tmp_path])


@pytest.mark.subprocess
def test_stand_in_really_breaks_import_torch(broken_plugin):
    done = run_py(["-c", "import torch"], env=broken_plugin)
    assert done.returncode != 0 and "Failed to load the backend extension: torch_acme" in done.stderr


@pytest.mark.subprocess
def test_doctor_json_reports_it_and_exits_1(broken_plugin):
    done = run_npudist(["doctor", "--json"], env=broken_plugin)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["torch"]["status"] == "fail"
    assert "libacme.so" in checks["torch"]["finding"]
    assert checks["accelerator:cpu"]["status"] == "ok"  # the other checks ran


@pytest.mark.subprocess
def test_launch_and_bench_refuse_without_a_traceback(broken_plugin):
    for args in (["launch", "--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "2"],
                 ["bench", "collective", "--op", "all_reduce"]):
        done = run_npudist(args, env=broken_plugin, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert "libacme.so" in " ".join(done.stderr.split())
        assert "step=" not in done.stdout


@pytest.mark.subprocess
def test_autoload_off_by_the_user_is_not_overridden(broken_plugin):
    """With TORCH_DEVICE_BACKEND_AUTOLOAD=0 set by hand torch imports and nothing is reported as broken."""
    env = {**broken_plugin, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = run_npudist(["doctor", "--json"], env=env)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["torch"]["status"] == "ok", checks["torch"]
