"""Shared test plumbing: run npudist (and real ranks) in subprocesses against this checkout's source."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The test tiers: a test that starts a process without its marker fails (tests/process_guard.py).
from tests.process_guard import (  # noqa: F401  pytest finds hooks by name in this module
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_fixture_setup,
    pytest_report_teststatus,
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_terminal_summary,
)

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
FAKES = REPO / "tests" / "fakes"


def child_env(extra: dict[str, str] | None = None, pythonpath: list[Path] | None = None) -> dict[str, str]:
    """Environment for a child process that imports this checkout's npudist, never an installed copy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPUDIST_", "OMPI_", "PMI_", "SLURM_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(k, None)
    paths = [str(p) for p in (pythonpath or [])] + [str(SRC)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


@functools.cache
def interpreter_dir() -> Path:
    """A directory whose ``python3`` and ``python`` run the interpreter running these tests.

    The fakes in tests/fakes/bin start with ``#!/usr/bin/env python3``. Put first on a child's PATH
    (``fakes_path``), this directory makes them run here instead of under whatever ``python3`` the
    machine's PATH names: a pyenv shim runs ``pyenv exec``, which puts its interpreter's ``bin/`` (and
    any ``npudist`` entry point installed there) first on the PATH of everything the fake starts.
    The entries are scripts that exec sys.executable, not symlinks: a venv's interpreter finds its
    site-packages from the path it was started by.
    """
    d = Path(tempfile.mkdtemp(prefix="npudist-tests-python-"))
    atexit.register(shutil.rmtree, d, True)
    for name in ("python3", "python"):
        exe = d / name
        exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        exe.chmod(0o755)
    return d


def fakes_path(*dirs: Path, inherited: str | None = None) -> str:
    """PATH for a child that runs fakes: this interpreter, tests/fakes/bin, ``dirs``, then the inherited
    PATH (this process's unless given), so nothing on the machine's PATH can stand in for a fake's tools."""
    inherited = os.environ.get("PATH", os.defpath) if inherited is None else inherited
    return os.pathsep.join([str(interpreter_dir()), str(FAKES / "bin"), *map(str, dirs), inherited])


def run_py(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python ARGS` with this checkout on the path; output captured as text; never hangs past timeout."""
    return subprocess.run([sys.executable, *args], env=env or child_env(), cwd=cwd or REPO, text=True,
                          capture_output=True, timeout=timeout, check=False)


def run_npudist(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return run_py(["-m", "npudist", *args], **kw)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the one port helper of the tests: import it from here)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports (rank i serves on base + i)."""
    import socket

    for _ in range(50):
        base = free_port(host)
        if base + count > 65536:
            continue
        try:
            for port in range(base + 1, base + count):
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def run_ranks(script: str, args: list[str], *, world: int = 2, env: dict[str, str] | None = None,
              pythonpath: list[Path] | None = None, timeout: float = 180) -> list[str]:
    """Start ``world`` ranks of ``script`` with torchrun's variables on a free port; fail with a rank's
    output when one exits non-zero, else return each rank's output (stdout and stderr together)."""
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, script, *args], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=child_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                       **(env or {})}, pythonpath=pythonpath))
        for r in range(world)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{logs[r][-3000:]}"
    return logs


@pytest.fixture
def repo() -> Path:
    return REPO


# The shared "golden run": 100 steps (the loss falls well below its start), checkpoints at 50 and 100, one
# skew exchange (at step 100), run log and telemetry on.
GOLDEN_ARGS = ["--steps", "100", "--log-every", "5", "--checkpoint-every", "50", "--exchange-every", "100"]


@dataclasses.dataclass(frozen=True)
class GoldenRun:
    run_dir: Path  # read it; copy it (shutil.copytree) before resuming or writing into it
    args: list[str]  # what followed `npudist launch --nproc-per-node 2`: the example, GOLDEN_ARGS, --run-dir
    done: subprocess.CompletedProcess[str]  # the launch: its console (rank 0's lines) and exit code

    def args_for(self, run_dir: Path) -> list[str]:
        """The same command line for a copy of the run directory (add --steps N to train on)."""
        return [str(run_dir) if a == str(self.run_dir) else a for a in self.args]


@pytest.fixture(scope="session")
def golden_run(tmp_path_factory: pytest.TempPathFactory) -> GoldenRun:
    """One 2-rank run of examples/train_ddp.py under `npudist launch`, shared by the tests that only read a
    finished run (its console, run log, checkpoints) instead of each launching its own. Tests that use it
    start ranks: mark them e2e."""
    run_dir = tmp_path_factory.mktemp("golden") / "run"
    args = [str(REPO / "examples" / "train_ddp.py"), *GOLDEN_ARGS, "--run-dir", str(run_dir)]
    done = run_npudist(["launch", "--nproc-per-node", "2", *args], env=child_env(), timeout=300)
    assert done.returncode == 0, f"the golden run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return GoldenRun(run_dir, args, done)


# CI (.ci/run) installs every tool the tests use, so there a skip means a test silently did not run; it lists
# the skips it accepts (hardware these machines lack) and any other skip fails the run.
_SKIPPED: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        _SKIPPED.append((report.nodeid, str(report.longrepr[2])))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    allowed = os.environ.get("NPUDIST_ALLOWED_SKIPS")
    if allowed is None:
        return
    import re

    bad = [(node, why) for node, why in _SKIPPED if not re.search(allowed, why)]
    if bad:
        lines = "\n".join(f"  {node}: {why}" for node, why in bad)
        print(f"\nNPUDIST_ALLOWED_SKIPS={allowed!r} but these tests skipped for another reason:\n{lines}",
              file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
