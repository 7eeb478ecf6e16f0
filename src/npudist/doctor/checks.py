"""The doctor's check registry and its software checks (settings, Python, torch, accelerators, tools, backends,
comm constraints). Each check is one function that reads only the Host it is given; the other areas
register theirs from their own modules (host_limits, network, ascend, processes, ascend_network, multinode),
in the order doctor/__init__.py imports them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import sys
from collections.abc import Callable
from pathlib import Path

from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult

Check = Callable[[Host], "CheckResult | list[CheckResult]"]
CHECKS: list[tuple[str, Check]] = []


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS.append((name, fn))
        return fn

    return register


def _base_version(version: str) -> tuple[int, ...]:
    """'2.1.0.post3' and '2.1.0+cpu' -> (2, 1, 0): the part vendors promise to match."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


@check("settings")
def settings(host: Host) -> CheckResult:
    from npudist.runtime.settings import Settings, SettingsError

    try:
        Settings.from_env(host.env)
    except SettingsError as exc:
        return CheckResult("settings", FAIL, str(exc), "fix the variable or unset it")
    return CheckResult("settings", OK, "every NPUDIST_* variable that is set parses")


@check("python")
def python_version(host: Host) -> CheckResult:
    v = platform.python_version()
    return CheckResult("python", OK, f"Python {v} ({sys.executable})")


@check("torch")
def torch_version(host: Host) -> CheckResult:
    from npudist.accelerators import backend_guard

    broken = backend_guard.from_env(host.env)
    if broken is not None:
        return CheckResult("torch", FAIL, f"`import torch` fails: device extension {broken.extension} does not load "
                           f"({broken.cause}); these checks ran with {backend_guard.AUTOLOAD_VAR}=0",
                           f"{backend_guard.vendor_fix(broken) or 'install the runtime it needs'}; or set "
                           f"{backend_guard.AUTOLOAD_VAR}=0 to run without {broken.extension}")
    import torch

    v = torch.__version__
    if _base_version(v) < (2, 1):
        return CheckResult("torch", FAIL, f"torch {v}", "npudist's core paths need torch >= 2.1")
    extra = "" if _base_version(v) >= (2, 4) else " (custom operators need torch >= 2.4)"
    return CheckResult("torch", OK, f"torch {v}{extra}")


@check("numpy")
def numpy_pair(host: Host) -> CheckResult:
    from npudist.runtime import numpy_torch

    numpy_v, torch_v = numpy_torch.installed("numpy"), numpy_torch.installed("torch")
    if numpy_v is None:
        return CheckResult("numpy", WARN, "numpy is not installed: tensor <-> numpy conversions fail",
                           "pip install numpy (pip install \"numpy<2\" with torch < 2.3)")
    wrong = numpy_torch.mismatch(torch_v, numpy_v)
    if wrong:
        finding, fix = wrong.split(" Fix: ", 1)
        return CheckResult("numpy", FAIL, finding, fix)
    return CheckResult("numpy", OK, f"numpy {numpy_v} works with torch {torch_v}")


def _simulating(host: Host) -> str | None:
    """The NPUDIST_SIMULATE mode when this process's NPU is npudist's simulation (npudist.sim)."""
    from npudist.runtime.settings import SIMULATE_VAR

    return host.env.get(SIMULATE_VAR, "").strip().lower() or None


def _stand_in(module: str = "torch_npu") -> bool:
    """Whether ``module`` on this path is npudist's stand-in (``npudist launch --simulate``), not the vendor's."""
    spec = importlib.util.find_spec(module)
    return spec is not None and "stand_in" in Path(spec.origin or "").parts


@check("simulation")
def simulation(host: Host) -> CheckResult:
    from npudist.runtime.settings import SIMULATE_MODES, SIMULATE_VAR

    mode = _simulating(host)
    if mode is None:
        return CheckResult("simulation", SKIP, "real hardware only (NPUDIST_SIMULATE unset)")
    if mode not in SIMULATE_MODES:
        return CheckResult("simulation", FAIL, f"{SIMULATE_VAR}={mode!r} is not a simulation mode",
                           f"choose one of {', '.join(SIMULATE_MODES)} or unset it")
    from npudist.sim import MODES

    return CheckResult("simulation", WARN, f"simulated NPU ({mode}): device npu and backend hccl are npudist.sim, "
                       f"enforcing the {MODES[mode]} row; nothing here runs on Ascend hardware or CANN",
                       f"unset {SIMULATE_VAR} to use real devices")


@check("accelerators")
def accelerators(host: Host) -> list[CheckResult]:
    from npudist.accelerators import VENDORS, why_unavailable

    forced = host.env.get("NPUDIST_ACCELERATOR", "").strip().lower()
    out = []
    if _simulating(host):
        from npudist.accelerators.vendors import SIMULATED_NPU

        reason = why_unavailable(SIMULATED_NPU)
        out.append(CheckResult("accelerator:npu-sim", OK if reason is None else FAIL,
                               reason or "npu-sim available (simulated; backend hccl over gloo)"))
    for vendor in VENDORS:
        name = f"accelerator:{vendor.name}"
        reason = why_unavailable(vendor)
        if reason is None:
            simulated = "simulated: " if vendor.module and _stand_in(vendor.module) else ""
            out.append(CheckResult(name, OK, f"{vendor.name} available ({simulated}backend {vendor.backend})"))
            continue
        installed = vendor.module is not None and importlib.util.find_spec(vendor.module) is not None
        if installed or forced == vendor.name:
            # An installed but broken vendor package is the classic "torch_npu without CANN" failure.
            setup = vendor.runtime_setup or f"fix the {vendor.module} installation (its driver/runtime)"
            fix = (f"unset NPUDIST_ACCELERATOR or fix {vendor.name}" if forced == vendor.name
                   else f"{setup}, or uninstall {vendor.module}")
            out.append(CheckResult(name, FAIL, reason, fix))
        else:
            out.append(CheckResult(name, SKIP, reason))
    return out


@check("tools")
def vendor_tools(host: Host) -> list[CheckResult]:
    from npudist.accelerators import VENDORS, why_unavailable

    out = []
    for vendor in VENDORS:
        if vendor.tool is None:
            continue
        found = host.which(vendor.tool)
        name = f"tool:{vendor.tool}"
        if found:
            out.append(CheckResult(name, OK, f"{vendor.tool} at {found}"))
        elif why_unavailable(vendor) is None:
            out.append(CheckResult(name, WARN, f"{vendor.name} is available but {vendor.tool} is not on PATH",
                                   f"install the vendor driver tools or add their folder to PATH "
                                   f"(device telemetry for {vendor.name} needs {vendor.tool})"))
        else:
            out.append(CheckResult(name, SKIP, f"{vendor.tool} not on PATH"))
    return out


@check("backends")
def backends(host: Host) -> CheckResult:
    import torch.distributed as dist

    from npudist.accelerators import accelerator

    if not dist.is_available():
        return CheckResult("backends", FAIL, "torch was built without torch.distributed",
                           "install a torch build with distributed support")
    probes = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available,
              "ucc": getattr(dist, "is_ucc_available", lambda: False)}
    have = [name for name, probe in probes.items() if probe()]
    skip = {*probes, "undefined", "fake"}  # "fake" is torch's own test backend
    registered = [b for b in getattr(dist.Backend, "backend_list", []) if b not in skip]
    have += [b for b in registered if b not in have]
    needed = accelerator().backend
    finding = f"compiled/registered: {', '.join(have) or 'none'}; {accelerator().name} needs {needed}"
    if needed not in have:
        return CheckResult("backends", FAIL, finding, f"install the package that registers {needed!r}")
    return CheckResult("backends", OK, finding)


@check("comm-constraints")
def comm_constraints(host: Host) -> CheckResult:
    """What the active backend (or NPUDIST_COMM_PROFILE) accepts, i.e. what npudist.comm will adapt."""
    from npudist.comm import PROFILE_VAR, PROFILES, active_constraints, describe

    name = host.env.get(PROFILE_VAR, "").strip()
    if name and name not in PROFILES:
        return CheckResult("comm-constraints", FAIL, f"{PROFILE_VAR}={name!r} is not a profile",
                           f"choose one of {', '.join(PROFILES)} or unset it")
    active = PROFILES[name] if name else active_constraints()
    origin = f" (forced by {PROFILE_VAR})" if name else ""
    return CheckResult("comm-constraints", OK, describe(active).replace("\n", "; ") + origin)
