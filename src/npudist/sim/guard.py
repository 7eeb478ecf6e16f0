"""Every ``npu:i`` a chip of its own: the simulated NPU's C++ device guard, built where a compiler exists.

torch's device guard for a PrivateUse1 backend written in Python (torch/csrc/acc/Module.cpp,
``PythonDeviceGuard``) reports one device and ignores ``setDevice``; autograd's engine, which keeps one ready
queue per device the guard reports, then fails on any tensor on ``npu:1``. ``guard.cpp`` is the guard a
vendor's C++ gives: a current device per thread and the host's chip count. It is compiled once per torch
on the machine (against the headers torch ships, a second or two) and registered before torch's Python guard.

Without a compiler (or when the build fails) the simulation keeps torch's Python guard: every simulated
tensor is on ``npu:0`` and ``npu:<i>`` names the process's one chip (docs/guide/simulated-npu.md). ``reason()``
says why the guard is missing. The loaded library and that reason are kept in ``SIM`` (sim/state.py).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from npudist.sim.state import SIM

SOURCE = "guard.cpp"
"""The guard's source, beside this module."""
BUILD_TIMEOUT_S = 300


def load(chips: int) -> bool:
    """Build (once per machine) and register the guard for ``chips`` devices; False, with ``reason()`` saying why,
    where it cannot be, so the caller keeps torch's one-device Python guard."""
    if SIM.guard is not None:
        return True
    path, SIM.guard_reason = build()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(str(path))
        lib.npudist_sim_guard_register.argtypes = [ctypes.c_int]
        lib.npudist_sim_guard_set.argtypes = [ctypes.c_int]
        if not lib.npudist_sim_guard_register(chips):
            SIM.guard_reason = "another device guard for PrivateUse1 was registered first"
            return False
    except OSError as exc:
        SIM.guard_reason = f"the guard did not load: {exc}"
        return False
    SIM.guard, SIM.guard_reason = lib, None
    return True


def reason() -> str | None:
    """Why ``npu:i`` are not separate devices in this process (None where they are)."""
    return SIM.guard_reason


def build() -> tuple[Path | None, str | None]:
    """The guard's library, built here if need be, without registering it; (None, why not) where it cannot be.
    Tests ask this to know which behaviour the ranks they start will have. One build per torch, C++ ABI and
    source, under npudist's cache (runtime/native.py, as the process-group watch is built)."""
    from npudist.runtime import native

    cxx = native.compiler()
    if cxx is None:
        return None, "no C++ compiler (c++, g++ or $CXX)"
    source = Path(__file__).with_name(SOURCE)
    try:
        path = native.cache_dir() / "sim_guard" / native.build_key(source)[:16] / "libnpudist_sim_guard.so"
        return native.build_library(source, path, cxx=cxx, libs=("c10",), timeout_s=BUILD_TIMEOUT_S), None
    except Exception as exc:  # a missing header, a failed build: the one-device fallback, with the reason
        return None, f"the guard did not build: {type(exc).__name__}: {str(exc)[:300]}"


def available() -> bool:
    """Whether ``npu:i`` are separate devices in this process."""
    return SIM.guard is not None


def current() -> int:
    return SIM.guard.npudist_sim_guard_current() if SIM.guard is not None else 0


def set_current(index: int) -> None:
    if SIM.guard is not None:
        SIM.guard.npudist_sim_guard_set(index)
