"""scripts/device-check.sh on a machine without a GPU (what CI has), and its report on real pytest output."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, child_env


def _helper():
    spec = importlib.util.spec_from_file_location("device_check_under_test", REPO / "scripts" / "device_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dc = _helper()


@pytest.mark.subprocess
@pytest.mark.skipif(torch.cuda.is_available() or shutil.which("nvidia-smi") is not None,
                    reason="this host has a GPU: the device check really runs there (make device-check)")
def test_script_without_a_gpu_skips_everything_with_reasons(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh")], cwd=REPO, text=True,
                          capture_output=True, timeout=240, env=child_env({"PYTHON": sys.executable, "OUT": str(out)}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    m = re.fullmatch(r"device-check: 0 passed, 0 failed, (\d+) skipped", lines[-1])
    assert m, lines[-5:]
    assert sum(line.startswith("device-check:") for line in lines) == 1
    summary = json.loads((out / "summary.json").read_text())
    checks = summary["checks"]
    skipped = int(m.group(1))
    assert summary["result"] == {"passed": 0, "failed": 0, "skipped": skipped} and skipped == len(checks)
    assert all(c["outcome"] == "skipped" and c["reason"] for c in checks)
    tests = [c for c in checks if c["kind"] == "pytest"]
    assert len(tests) >= 10 and all(c["name"].startswith("tests/cuda/") for c in tests)
    assert all("needs an NVIDIA GPU" in c["reason"] for c in tests), tests
    [bench] = [c for c in checks if c["kind"] == "bench"]
    assert "CUDA" in bench["reason"]
    assert summary["environment"]["torch"] == torch.__version__ and summary["environment"]["cuda_reason"]
    assert summary["doctor"]["summary"]["ok"] > 0  # npudist doctor --json ran and was read
    assert {s["name"] for s in summary["steps"]} >= {"env", "doctor", "pytest-cuda", "bench-all_reduce"}
    assert (out / "pytest-cuda.log").stat().st_size > 0 and (out / "pytest-cuda.xml").exists()


SAMPLE = textwrap.dedent("""
    import pytest

    def test_good():
        assert 1 + 1 == 2

    def test_bad():
        assert 1 + 1 == 3, "arithmetic"

    @pytest.mark.skip(reason="no gpu here")
    def test_skipped():
        pass
""")


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A real pytest run of three tests: its junit XML and its -v output."""
    tmp = tmp_path_factory.mktemp("sample")
    (tmp / "pytest.ini").write_text("[pytest]\n")
    (tmp / "test_sample.py").write_text(SAMPLE)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "test_sample.py",
                           f"--junitxml={tmp / 'junit.xml'}"], cwd=tmp, text=True, capture_output=True,
                          timeout=120, env=child_env())
    assert proc.returncode == 1, proc.stdout[-2000:]
    return (tmp / "junit.xml").read_text(), proc.stdout


def _outcomes(checks: list[dict]) -> dict[str, str]:
    return {c["name"].split("::")[-1]: c["outcome"] for c in checks}


@pytest.mark.subprocess
def test_report_reads_pytest_junit_and_verbose_output(sample_run: tuple[str, str]) -> None:
    junit, log = sample_run
    want = {"test_good": "passed", "test_bad": "failed", "test_skipped": "skipped"}
    from_junit = dc.junit_checks(junit)
    assert _outcomes(from_junit) == want
    assert {c["name"] for c in from_junit} >= {"test_sample.py::test_good"}
    reasons = {c["name"].split("::")[-1]: c["reason"] for c in from_junit}
    assert "no gpu here" in reasons["test_skipped"] and "arithmetic" in reasons["test_bad"]
    assert _outcomes(dc.verbose_log_checks(log)) == want
    # Killed by the step's time limit while test_skipped ran: no outcome on its line, no junit file.
    cut = log[: log.index("test_sample.py::test_skipped") + len("test_sample.py::test_skipped ")]
    stopped = dc.pytest_checks({"status": "ran", "rc": 124, "seconds": 330, "limit_s": 330, "note": ""}, None, cut)
    assert _outcomes(stopped) == {**want, "test_skipped": "failed", "pytest -m cuda": "failed"}
    assert dc.summary_line(dc.counts(stopped)) == "device-check: 1 passed, 3 failed, 0 skipped"


def test_report_counts_a_pytest_run_that_did_not_test() -> None:
    ran = {"status": "ran", "seconds": 3, "limit_s": 330, "note": ""}
    [none] = dc.pytest_checks({**ran, "rc": 5}, None, "")
    assert none["outcome"] == "failed" and "no test marked cuda" in none["reason"]
    [crashed] = dc.pytest_checks({**ran, "rc": 2}, None, "")
    assert crashed["outcome"] == "failed" and "exited 2" in crashed["reason"]
    [not_run] = dc.pytest_checks({"status": "skipped", "rc": None, "seconds": 0, "limit_s": None,
                                  "note": "no time left in the 470 s budget"}, None, "")
    assert not_run["outcome"] == "failed" and "budget" in not_run["reason"]


def test_report_bench_and_gpu_checks() -> None:
    ran = {"status": "ran", "rc": 0, "seconds": 20, "limit_s": 120, "note": ""}
    meta = {"world": 1, "backend": "nccl"}
    row = {"size_bytes": 1024, "time_us": 20.0, "wrong": 0}
    assert dc.bench_check(ran, {"meta": meta, "rows": [row]}, "")["outcome"] == "passed"
    bad = dc.bench_check(ran, {"meta": meta, "rows": [row, {**row, "size_bytes": 2048, "wrong": 3}]}, "")
    assert bad["outcome"] == "failed" and "2048" in bad["reason"]
    slow = dc.bench_check({**ran, "rc": 124}, None, "sizes 3/19")
    assert slow["outcome"] == "failed" and "120 s limit" in slow["reason"]
    # `nvidia-smi -L` prints one "GPU i: NAME (UUID: ...)" line per GPU.
    smi = "GPU 0: NVIDIA H200 (UUID: GPU-5b3c0a3e-0000-0000-0000-000000000000)\n"
    cpu_torch = {"torch": "2.13.0+cpu", "torch_cuda": None, "cuda_device_count": 0}
    no_cuda = dc.gpu_check(smi, cpu_torch)
    assert no_cuda["outcome"] == "failed" and "2.13.0+cpu has no CUDA" in no_cuda["reason"]
    assert dc.gpu_check(smi, {"torch": "2.11.0", "torch_cuda": "13.0", "cuda_device_count": 1})["outcome"] == "passed"
    assert dc.gpu_check("", cpu_torch) is None


@pytest.mark.subprocess
def test_report_fails_a_gpu_host_whose_torch_cannot_use_it(tmp_path: Path, sample_run: tuple[str, str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Files as device-check.sh leaves them where nvidia-smi lists a GPU but torch is a CPU build: the
    skipped tests must not read as a clean run."""
    junit, log = sample_run
    (tmp_path / "nvidia-smi.log").write_text("GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n")
    (tmp_path / "env.json").write_text(json.dumps({"torch": "2.13.0+cpu", "torch_cuda": None, "cuda_device_count": 0,
                                                   "cuda_reason": "no CUDA"}))
    (tmp_path / "steps.tsv").write_text("pytest-cuda\tran\t1\t12\t330\tpytest-cuda.log\n"
                                        "bench-all_reduce\tskipped\t\t0\t\tno CUDA\n"
                                        "bench-checkpoint\tskipped\t\t0\t\tno CUDA\n")
    (tmp_path / "pytest-cuda.xml").write_text(junit)
    (tmp_path / "pytest-cuda.log").write_text(log)
    assert dc.report(tmp_path) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "device-check: 1 passed, 2 failed, 3 skipped"
    summary = json.loads((tmp_path / "summary.json").read_text())
    [gpu] = [c for c in summary["checks"] if c["kind"] == "environment"]
    assert gpu["outcome"] == "failed" and "lists 1 GPU(s) but torch 2.13.0+cpu has no CUDA" in gpu["reason"]


def test_the_checkpoint_measurement_passes_with_its_figures_and_fails_without_them() -> None:
    step = {"name": "bench-checkpoint", "status": "ran", "rc": 0, "seconds": 70, "limit_s": 120}
    result = {"summary": {"npudist_steady_blocking_s": 0.21, "first_blocking_vs_dcp": 0.8, "durable_vs_dcp": 0.95}}
    ok = dc.checkpoint_check(step, result, "")
    assert ok["outcome"] == "passed" and "steady blocking 0.210 s" in ok["reason"] and "0.95x" in ok["reason"]
    died = dc.checkpoint_check({**step, "rc": 124}, None, "Traceback ... KeyError")
    assert died["outcome"] == "failed" and "120 s limit" in died["reason"] and "KeyError" in died["reason"]
    assert dc.checkpoint_check(None, None, "")["outcome"] == "skipped"
