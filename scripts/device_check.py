"""Helpers of scripts/device-check.sh: describe the environment, and turn the run's files into the summary.

    python scripts/device_check.py env OUT_DIR      -> OUT_DIR/env.json, printed for the log
    python scripts/device_check.py doctor OUT_DIR   -> prints the summary of OUT_DIR/doctor.json
    python scripts/device_check.py report OUT_DIR   -> OUT_DIR/summary.json; prints every check and, last,
                                                        "device-check: N passed, M failed, K skipped";
                                                        exit 1 when a check failed

``report`` uses the standard library only, so it still reports when torch itself is broken. The checks
it counts are the pytest cases run with ``-m cuda``, the collective benchmark, and (on a host where
nvidia-smi lists a GPU) whether torch can use that GPU.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

PYTEST_STEP = "pytest-cuda"
BENCH_STEP = "bench-all_reduce"
CHECKPOINT_STEP = "bench-checkpoint"
TIMEOUT_RCS = (124, 137)  # coreutils timeout: 124 after the signal, 137 after --kill-after
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def _nccl_version(torch: Any) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    if isinstance(v, tuple):
        return ".".join(map(str, v))
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}" if isinstance(v, int) else str(v)  # 2708 -> 2.7.8


# Module -> requirement (pyproject.toml's runtime dependencies and test extra, nvidia-ml-py for NVML):
# what the set-up installs on a GPU host where the module is missing.
REQUIREMENTS = {"typer": "typer>=0.9", "rich": "rich>=13", "prometheus_client": "prometheus_client>=0.17",
                "psutil": "psutil>=5.9", "yaml": "PyYAML>=6", "pytest": "pytest>=7",
                "pytest_timeout": "pytest-timeout>=2", "pynvml": "nvidia-ml-py>=12"}


def missing_requirements() -> list[str]:
    import importlib.util

    return [req for module, req in REQUIREMENTS.items() if importlib.util.find_spec(module) is None]


def cuda_reason(info: dict[str, Any]) -> str | None:
    """Why this Python cannot use a CUDA device (None when it can)."""
    if "torch_error" in info:
        return f"torch cannot be imported: {info['torch_error']}"
    if not info.get("torch_cuda"):
        return f"no CUDA: torch {info['torch']} is built without CUDA"
    if not info.get("cuda_device_count"):
        return info.get("cuda_error") or (
            f"no CUDA device: torch {info['torch']} (CUDA {info['torch_cuda']}) sees none "
            "(torch.cuda.is_available() is False)")
    return None


def environment() -> dict[str, Any]:
    """Versions and devices as this Python sees them; an import failure is recorded, not raised."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                            "host": socket.gethostname(), "missing": missing_requirements()}
    try:
        import torch
    except Exception as exc:
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
        info["cuda_reason"] = cuda_reason(info)
        return info
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, nccl=None, cuda_available=False,
                cuda_device_count=0, devices=[])
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            info["nccl"] = _nccl_version(torch)
            info["cuda_device_count"] = torch.cuda.device_count()
            for i in range(info["cuda_device_count"]):
                p = torch.cuda.get_device_properties(i)
                info["devices"].append({"index": i, "name": p.name, "total_memory_bytes": int(p.total_memory),
                                        "capability": f"{p.major}.{p.minor}",
                                        "multiprocessors": p.multi_processor_count})
    except Exception as exc:
        info["cuda_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from importlib.metadata import version

        info["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception:
        info["nvidia_ml_py"] = None
    try:
        from npudist._version import __version__

        info["npudist"] = __version__
    except Exception as exc:
        info["npudist_error"] = f"{type(exc).__name__}: {exc}"
    info["cuda_reason"] = cuda_reason(info)
    return info


def describe_environment(info: dict[str, Any]) -> list[str]:
    lines = [f"python {info['python']} ({info['executable']}), host {info['host']}"]
    if "torch_error" in info:
        return [*lines, f"torch: cannot import: {info['torch_error']}"]
    lines.append(f"torch {info['torch']}, CUDA {info['torch_cuda'] or 'none (CPU build)'}, "
                 f"NCCL {info['nccl'] or '-'}, npudist {info.get('npudist', '?')}, "
                 f"nvidia-ml-py {info.get('nvidia_ml_py') or 'not installed'}")
    if not info["devices"]:
        lines.append(f"CUDA devices: none ({info['cuda_reason']})")
    if info["missing"]:
        lines.append(f"not installed: {', '.join(info['missing'])}")
    for d in info["devices"]:
        lines.append(f"cuda:{d['index']}: {d['name']}, {d['total_memory_bytes'] / 2**30:.1f} GiB, "
                     f"compute capability {d['capability']}, {d['multiprocessors']} SMs")
    return lines


# ---- the report: pure functions over the run's files ----

def read_steps(text: str) -> dict[str, dict[str, Any]]:
    """steps.tsv lines (name, status, rc, seconds, limit_s, note) -> {name: step}; the last line of a name wins."""
    steps = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 6:
            continue
        name, status, rc, seconds, limit, note = parts[:6]
        steps[name] = {"name": name, "status": status, "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                       "seconds": int(seconds) if seconds.isdigit() else None,
                       "limit_s": int(limit) if limit.isdigit() else None, "note": note}
    return steps


def junit_checks(xml_text: str) -> list[dict[str, Any]]:
    """One check per testcase of a pytest junit XML file."""
    checks = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}" if module else str(case.get("name"))
        outcome, reason = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason = FAILED, child.get("message") or (child.text or "").strip()[-500:]
                break
            if child.tag == "skipped":
                outcome, reason = SKIPPED, child.get("message") or ""
        checks.append({"name": name, "kind": "pytest", "outcome": outcome, "reason": reason.strip(),
                       "seconds": float(case.get("time") or 0)})
    return checks


_VERBOSE = re.compile(r"^(\S+::\S+)(?: (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)(?: \((.*)\))?)?"
                      r"(?:\s+\[\s*\d+%\])?\s*$")


def verbose_log_checks(log: str) -> list[dict[str, Any]]:
    """Checks from `pytest -v` lines, for a run stopped before it wrote its junit file; a test that had
    started without an outcome is the one the time limit stopped."""
    checks: dict[str, dict[str, Any]] = {}
    for line in log.splitlines():
        m = _VERBOSE.match(line.strip())
        if not m:
            continue
        name, word, reason = m.groups()
        if word is None:
            checks.setdefault(name, {"name": name, "kind": "pytest", "outcome": FAILED,
                                     "reason": "stopped by the step's time limit", "seconds": None})
            continue
        outcome = {"PASSED": PASSED, "XPASS": PASSED, "SKIPPED": SKIPPED, "XFAIL": SKIPPED}.get(word, FAILED)
        checks[name] = {"name": name, "kind": "pytest", "outcome": outcome, "reason": reason or "", "seconds": None}
    return list(checks.values())


def pytest_checks(step: dict[str, Any] | None, junit: str | None, log: str) -> list[dict[str, Any]]:
    if step is None or step["status"] == SKIPPED:
        reason = step["note"] if step else "pytest did not run"
        return [{"name": "pytest -m cuda", "kind": "pytest", "outcome": FAILED, "reason": reason, "seconds": None}]
    rc = step["rc"]
    checks = junit_checks(junit) if junit else verbose_log_checks(log)
    if rc in TIMEOUT_RCS:
        checks.append({"name": "pytest -m cuda", "kind": "pytest", "outcome": FAILED,
                       "reason": f"stopped at its {step['limit_s']} s limit", "seconds": step["seconds"]})
    elif rc == 5:
        checks.append({"name": "pytest -m cuda", "kind": "pytest", "outcome": FAILED,
                       "reason": "no test marked cuda was collected", "seconds": step["seconds"]})
    elif rc not in (0, 1) or (rc == 1 and not any(c["outcome"] == FAILED for c in checks)):
        checks.append({"name": "pytest -m cuda", "kind": "pytest", "outcome": FAILED,
                       "reason": f"pytest exited {rc}: see {PYTEST_STEP}.log", "seconds": step["seconds"]})
    return checks


def bench_check(step: dict[str, Any] | None, result: dict[str, Any] | None, log: str) -> dict[str, Any]:
    check = {"name": "npudist bench collective --op all_reduce", "kind": "bench", "outcome": PASSED, "reason": "",
             "seconds": step["seconds"] if step else None}
    if step is None or step["status"] == SKIPPED:
        return {**check, "outcome": SKIPPED, "reason": step["note"] if step else "not run"}
    if step["rc"] != 0 or result is None:
        why = f"stopped at its {step['limit_s']} s limit" if step["rc"] in TIMEOUT_RCS else f"exit {step['rc']}"
        return {**check, "outcome": FAILED, "reason": f"{why}: {log.strip()[-800:]}"}
    wrong = [r for r in result.get("rows", []) if r.get("wrong")]
    if not result.get("rows") or wrong:
        return {**check, "outcome": FAILED, "reason": f"wrong results at sizes {[r['size_bytes'] for r in wrong]}"
                if wrong else "no rows"}
    meta = result["meta"]
    big = max(result["rows"], key=lambda r: r["size_bytes"])
    return {**check, "reason": f"{meta['world']} rank(s) on {meta['backend']}: {len(result['rows'])} sizes, "
                               f"{big['size_bytes']} B in {big['time_us']:.1f} µs"}


def checkpoint_check(step: dict[str, Any] | None, result: dict[str, Any] | None, log: str) -> dict[str, Any]:
    """benchmarks/checkpoint_gpu.py: passed when it measured both sides (its figures are in the summary; the
    issue-33 targets it reports are read there, not judged here)."""
    check = {"name": "benchmarks/checkpoint_gpu.py (4 GiB, npudist vs DCP async_save)", "kind": "measurement",
             "outcome": PASSED, "reason": "", "seconds": step["seconds"] if step else None}
    if step is None or step["status"] == SKIPPED:
        return {**check, "outcome": SKIPPED, "reason": step["note"] if step else "not run"}
    if step["rc"] != 0 or result is None or "summary" not in result:
        why = f"stopped at its {step['limit_s']} s limit" if step["rc"] in TIMEOUT_RCS else f"exit {step['rc']}"
        return {**check, "outcome": FAILED, "reason": f"{why}: {log.strip()[-800:]}"}
    s = result["summary"]
    return {**check, "reason": f"steady blocking {s['npudist_steady_blocking_s']:.3f} s, first vs DCP "
                               f"{s['first_blocking_vs_dcp']:.2f}x, durable vs DCP {s['durable_vs_dcp']:.2f}x"}


def gpu_check(nvidia_smi: str, env: dict[str, Any]) -> dict[str, Any] | None:
    """Where nvidia-smi lists GPUs, torch must be able to use them (else every test would just skip)."""
    listed = re.findall(r"^GPU \d+:", nvidia_smi, re.M)
    if not listed:
        return None
    check = {"name": "torch uses the GPUs nvidia-smi lists", "kind": "environment", "seconds": None}
    count = env.get("cuda_device_count", 0)
    if count >= 1:
        return {**check, "outcome": PASSED, "reason": f"nvidia-smi lists {len(listed)}, torch sees {count}"}
    why = env.get("torch_error") or env.get("cuda_error") or (
        f"torch {env.get('torch')} has no CUDA" if not env.get("torch_cuda") else "torch.cuda.is_available() is False")
    return {**check, "outcome": FAILED, "reason": f"nvidia-smi lists {len(listed)} GPU(s) but {why}"}


def doctor_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    return {"exit_code": doc.get("exit_code"), "summary": doc.get("summary"),
            "not_ok": [{k: c.get(k) for k in ("name", "status", "finding")} for c in doc.get("checks", [])
                       if c.get("status") in ("fail", "warn")]}


def describe_doctor(doc: dict[str, Any] | None) -> list[str]:
    short = doctor_summary(doc)
    if short is None:
        return ["doctor: no JSON document (see doctor.log)"]
    s = short["summary"] or {}
    lines = [f"doctor: exit {short['exit_code']}; " + ", ".join(f"{k} {v}" for k, v in s.items())]
    lines += [f"  {c['status']}: {c['name']}: {c['finding']}" for c in short["not_ok"]]
    return lines


def counts(checks: list[dict[str, Any]]) -> dict[str, int]:
    return {o: sum(c["outcome"] == o for c in checks) for o in (PASSED, FAILED, SKIPPED)}


def summary_line(n: dict[str, int]) -> str:
    return f"device-check: {n[PASSED]} passed, {n[FAILED]} failed, {n[SKIPPED]} skipped"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _json(path: Path) -> Any:
    text = _read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def report(out: Path) -> int:
    steps = read_steps(_read(out / "steps.tsv") or "")
    env = _json(out / "env.json") or {}
    bench = _json(out / f"{BENCH_STEP}.json")
    checks = []
    gpu = gpu_check(_read(out / "nvidia-smi.log") or "", env)
    if gpu is not None:
        checks.append(gpu)
    checks += pytest_checks(steps.get(PYTEST_STEP), _read(out / f"{PYTEST_STEP}.xml"),
                            _read(out / f"{PYTEST_STEP}.log") or "")
    checks.append(bench_check(steps.get(BENCH_STEP), bench, _read(out / f"{BENCH_STEP}.log") or ""))
    measured = _json(out / f"{CHECKPOINT_STEP}.json")
    checks.append(checkpoint_check(steps.get(CHECKPOINT_STEP), measured, _read(out / f"{CHECKPOINT_STEP}.log") or ""))
    n = counts(checks)
    line = summary_line(n)
    started = _json(out / "started.json") or {}
    summary = {
        "result": n, "line": line, "exit_code": 1 if n[FAILED] else 0,
        "started_at": started.get("started_at"), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": (time.time() - started["epoch"]) if "epoch" in started else None,
        "environment": env, "doctor": doctor_summary(_json(out / "doctor.json")),
        "steps": list(steps.values()), "checks": checks, "bench": bench, "checkpoint": measured,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for c in checks:
        note = f"  ({c['reason']})" if c["reason"] and c["outcome"] != PASSED else ""
        print(f"{c['outcome'].upper():8} {c['name']}{note}")
    print(f"summary: {out / 'summary.json'}")
    print(line)
    return summary["exit_code"]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("env", "doctor", "report"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    if argv[0] == "report":
        return report(out)
    if argv[0] == "doctor":
        print("\n".join(describe_doctor(_json(out / "doctor.json"))))
        return 0
    info = environment()
    (out / "env.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    print("\n".join(describe_environment(info)))
    return 1 if "torch_error" in info else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
