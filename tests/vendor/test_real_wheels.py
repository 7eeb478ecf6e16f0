"""The CLI against the real vendor packages, installed where their hardware and runtime are absent.

`.ci/run` builds a second virtual environment with the released `torch==2.13.0` + `torch-npu==2.13.0` (no
CANN on these machines, so torch_npu's `import torch_npu._C` fails on libhccl.so) and `nvidia-ml-py` (no
NVIDIA driver) and names its Python in NPUDIST_REAL_VENDOR_PYTHON. Without it these tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env, fakes_path, free_port
from tests.telemetry.exp_helpers import families, scrape

VENDOR_PYTHON = os.environ.get("NPUDIST_REAL_VENDOR_PYTHON")
# Every test runs npudist in the vendor venv's Python (skipped here, run by .ci/run).
pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(not VENDOR_PYTHON, reason="NPUDIST_REAL_VENDOR_PYTHON unset: no venv with the "
                                 "real torch-npu wheel (.ci/run makes one)")]


def _run(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VENDOR_PYTHON, *args], env=child_env(env), cwd=REPO, text=True, capture_output=True,
                          timeout=timeout, check=False)


def test_the_wheel_really_breaks_import_torch_here():
    """The premise: without CANN, the released torch_npu makes `import torch` itself raise."""
    done = _run(["-c", "import torch"])
    assert done.returncode != 0
    assert "Failed to load the backend extension: torch_npu" in done.stderr
    assert "libhccl.so" in done.stderr


def test_import_npudist_and_version_survive():
    done = _run(["-c", "import npudist; print(npudist.__version__)"])
    assert done.returncode == 0, done.stderr
    done = _run(["-m", "npudist", "--version"])
    assert done.returncode == 0 and done.stdout.startswith("npudist "), done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_reports_the_broken_stack_and_exits_1():
    table = _run(["-m", "npudist", "doctor"], COLUMNS="200")
    assert table.returncode == 1, table.stderr
    assert "Traceback" not in table.stdout + table.stderr
    assert "libhccl.so" in table.stdout and "set_env.sh" in table.stdout

    done = _run(["-m", "npudist", "doctor", "--json"])
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)  # one JSON document, nothing else on stdout
    failed = {c["name"]: c for c in doc["checks"] if c["status"] == "fail"}
    assert {"torch", "accelerator:npu", "ascend-env"} <= set(failed)
    assert "libhccl.so" in failed["torch"]["finding"]
    assert "set_env.sh" in failed["torch"]["fix"] and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in failed["torch"]["fix"]
    assert "libhccl.so" in failed["accelerator:npu"]["finding"]
    # The other checks still ran (torch imported with autoload off for them).
    assert any(c["name"] == "accelerator:cpu" and c["status"] == "ok" for c in doc["checks"])


def test_launch_refuses_before_any_rank_starts():
    start = time.monotonic()
    done = _run(["-m", "npudist", "launch", "--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "5"],
                timeout=30)
    assert done.returncode != 0
    assert time.monotonic() - start < 30
    assert "Traceback" not in done.stderr
    err = " ".join(done.stderr.split())  # rich folds long lines
    assert "torch_npu failed to load" in err and "libhccl.so" in err
    assert "set_env.sh" in err and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in err
    assert "step=" not in done.stdout  # no rank trained


def test_user_autoload_off_is_respected_and_npu_named_unavailable():
    """With the variable set by hand torch imports, and asking for the NPU names the real loader error."""
    code = ("import npudist\n"
            "from npudist.accelerators import AcceleratorUnavailable, get\n"
            "print(npudist.accelerator().name)\n"
            "try:\n    get('npu')\nexcept AcceleratorUnavailable as e:\n    print('unavailable:', e)\n")
    done = _run(["-c", code], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[:2]
    assert first == "cpu"
    assert second.startswith("unavailable:") and "libhccl.so" in second


def _serve(args: list[str], port: int, want: str, **env: str) -> tuple[str, str]:
    """Start `npudist exporter`, scrape it until WANT appears (or 40 s), stop it; (metrics, stderr)."""
    proc = subprocess.Popen([VENDOR_PYTHON, "-m", "npudist", "exporter", "--listen", f"127.0.0.1:{port}",
                             "--interval", "200ms", *args], env=child_env(env), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    text, deadline = "", time.monotonic() + 40
    try:
        while time.monotonic() < deadline:
            try:
                text = scrape(f"http://127.0.0.1:{port}/metrics", timeout=2)
                if want in text:
                    break
            except OSError:
                pass
            time.sleep(0.3)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    return text, err


def test_exporter_serves_npu_smi_metrics_with_the_broken_python_stack():
    port = free_port()
    path = fakes_path()
    text, err = _serve(["--source", "auto"], port, "npudist_device_power_watts{", PATH=path)
    assert "Traceback" not in err
    assert "torch_npu does not load" in err
    npu = [labels for name, labels, _ in _samples(text) if name == "npudist_device_power_watts"]
    assert npu and all(dict(labels)["vendor"] == "npu" for labels in npu)


def test_exporter_keeps_serving_when_real_nvml_has_no_driver():
    port = free_port()
    text, err = _serve(["--source", "nvml"], port, 'npudist_collector_errors_total{collector="nvml"')
    assert "NVML Shared Library Not Found" in err  # NVML's own error (NVMLError_LibraryNotFound)
    errors = [v for name, labels, v in _samples(text)
              if name == "npudist_collector_errors_total" and dict(labels).get("collector") == "nvml"]
    assert errors and errors[0] >= 1


def _samples(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [(s.name, tuple(sorted(s.labels.items())), s.value) for fam in families(text).values()
            for s in fam.samples]


def test_fakes_tree_is_not_on_the_vendor_path():
    """These tests use the real wheel: the fake torch_npu must not shadow it."""
    done = _run(["-c", "import importlib.util as u; print(u.find_spec('torch_npu').origin)"])
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(Path(VENDOR_PYTHON).parent.parent)


def test_nvml_reliability_names_exist_in_the_released_nvidia_ml_py():
    """Every pynvml name the reliability source calls is in the released wheel (the fake could drift)."""
    code = ("import json, pynvml; from npudist.telemetry.sources.nvml_reliability import API_NAMES; "
            "print(json.dumps([n for n in API_NAMES if not hasattr(pynvml, n)]))")
    done = _run(["-c", code])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
