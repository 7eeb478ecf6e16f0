"""A small C++ library built against the installed torch: once per torch build, C++ ABI, interpreter and
source, under npudist's cache; the first process builds, the others wait on a lock and load what it wrote.

The process-group watch (comm/pg_watch.py) and the simulated NPU's device guard (sim/guard.py) are built
this way. torch is imported only when something is built: this module stays on the ground floor.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CACHE_VAR = "NPUDIST_CACHE_DIR"
"""Where built libraries go (default: $XDG_CACHE_HOME/npudist, else ~/.cache/npudist, else the temp dir)."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(CACHE_VAR):
        return Path(env[CACHE_VAR])
    base = env.get("XDG_CACHE_HOME") or (str(Path.home() / ".cache") if Path.home().is_dir() else "")
    return Path(base or tempfile.gettempdir()) / "npudist"


def compiler() -> str | None:
    """$CXX, else c++, else g++ on PATH; None when there is none."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _torch() -> Any:
    import torch

    return torch


def abi() -> int:
    return int(getattr(_torch()._C, "_GLIBCXX_USE_CXX11_ABI", 1))


def build_key(source: Path) -> str:
    """What a build depends on: the source, torch's version and place, its C++ ABI, the interpreter."""
    torch = _torch()
    key = hashlib.sha256(Path(source).read_bytes())
    key.update(f"{torch.__version__}|{torch.__file__}|{abi()}|{sys.version_info[:2]}".encode())
    return key.hexdigest()


def command(cxx: str, source: Path, out: Path, *, std: str, libs: Sequence[str]) -> list[str]:
    """The compiler's command line: a shared library against torch's headers, linked to ``libs``."""
    root = Path(_torch().__file__).parent
    include, lib = root / "include", root / "lib"
    return [cxx, "-O2", "-shared", "-fPIC", f"-std={std}", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi()}",
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", str(source), f"-L{lib}",
            *(f"-l{name}" for name in libs), f"-Wl,-rpath,{lib}", "-o", str(out)]


class BuildFailed(RuntimeError):
    """The compiler failed or could not run; the message is the end of what it said (or why it did not run)."""


def build_library(source: Path, path: Path, *, cxx: str, libs: Sequence[str], timeout_s: float,
                  stds: Sequence[str] = ("c++17", "c++20")) -> Path:
    """``path`` built from ``source`` unless it is there already. Each standard in ``stds`` is tried in turn
    (torch up to 2.x builds as C++17; a newer one may need C++20); the library appears whole or not at all."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        errors = []
        for std in stds:
            try:
                done = subprocess.run(command(cxx, source, tmp, std=std, libs=libs), capture_output=True,
                                      text=True, timeout=timeout_s, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                tmp.unlink(missing_ok=True)
                raise BuildFailed(str(exc)) from exc
            if done.returncode == 0:
                os.replace(tmp, path)
                return path
            errors.append(done.stderr.strip()[-600:] or f"exit status {done.returncode}")
        tmp.unlink(missing_ok=True)
        raise BuildFailed(errors[-1])
