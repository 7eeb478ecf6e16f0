"""Doctor checks of an Ascend host's software: CANN's environment, torch_npu against torch, the torch /
torch_npu / CANN triad against the release table, HCCL's timeouts."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

from npudist.doctor.ascend_compat import TORCH_NPU_RELEASES
from npudist.doctor.checks import _base_version, _stand_in, check
from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult


def parse_toolkit_version(text: str) -> str | None:
    """`version=8.0.RC1` from ascend_toolkit_install.info, or `Version=...` from version.info/version.cfg."""
    match = re.search(r"^\s*(?:version|Version)\s*=\s*\[?([^\]\s:]+)", text, re.MULTILINE)
    return match.group(1) if match else None


_TOOLKIT_VERSION_FILES = ("*-linux/ascend_toolkit_install.info", "version.info", "version.cfg")


def cann_version(home: Path) -> str | None:
    """The toolkit's version from the first version file under ``home`` that names one."""
    for pattern in _TOOLKIT_VERSION_FILES:
        for f in sorted(home.glob(pattern)):
            version = parse_toolkit_version(f.read_text(errors="replace"))
            if version:
                return version
    return None


@check("ascend-env")
def ascend_env(host: Host) -> CheckResult:
    # CANN's set_env.sh exports both names; torch_npu reads ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME.
    home = host.env.get("ASCEND_HOME_PATH") or host.env.get("ASCEND_TOOLKIT_HOME")
    npu_installed = importlib.util.find_spec("torch_npu") is not None and not _stand_in()
    fix_source = "source /usr/local/Ascend/ascend-toolkit/set_env.sh (or your CANN install's set_env.sh)"
    if not home:
        if npu_installed:
            return CheckResult("ascend-env", FAIL, "torch_npu is installed but ASCEND_HOME_PATH and "
                               "ASCEND_TOOLKIT_HOME are unset", fix_source)
        return CheckResult("ascend-env", SKIP, "no CANN toolkit configured (ASCEND_HOME_PATH unset)")
    home_path = Path(home)
    if not home_path.is_dir():
        return CheckResult("ascend-env", FAIL, f"ASCEND_HOME_PATH={home} does not exist", fix_source)
    lib_dirs = [d for d in host.env.get("LD_LIBRARY_PATH", "").split(":") if d]
    has_runtime = any((Path(d) / "libascendcl.so").exists() for d in lib_dirs)
    version = cann_version(home_path)
    shown = f"CANN {version}" if version else "CANN version unknown (no version file found)"
    if not has_runtime:
        return CheckResult("ascend-env", FAIL, f"{shown} at {home}, but no LD_LIBRARY_PATH entry holds "
                           "libascendcl.so", fix_source)
    return CheckResult("ascend-env", OK, f"{shown} at {home}; runtime libraries on LD_LIBRARY_PATH")


@check("torch-npu-version")
def torch_npu_version(host: Host) -> CheckResult:
    import torch

    if _stand_in():
        return CheckResult("torch-npu-version", SKIP, "torch_npu here is npudist's simulated stand-in")
    try:
        npu_version = importlib.metadata.version("torch_npu")
    except importlib.metadata.PackageNotFoundError:
        if importlib.util.find_spec("torch_npu") is None:
            return CheckResult("torch-npu-version", SKIP, "torch_npu not installed")
        npu_version = "unknown"
    if npu_version == "unknown" or _base_version(npu_version) != _base_version(torch.__version__):
        return CheckResult(
            "torch-npu-version", FAIL, f"torch_npu {npu_version} does not match torch {torch.__version__}",
            "install the torch_npu release built for this torch (a mismatch shows up later as "
            "'undefined symbol' import errors); see torch_npu's version table")
    return CheckResult("torch-npu-version", OK, f"torch_npu {npu_version} matches torch {torch.__version__}")


_CANN_RELEASE = re.compile(r"\d+\.\d+\.(?:\d+|RC\d+)", re.IGNORECASE)
"""A release name as the compatibility table writes it (8.0.RC1, 8.5.0); a 5-part build number is not one."""


def version_triad(torch_version: str, npu_version: str, cann: str | None) -> CheckResult:
    """torch, torch_npu and CANN against the release table: FAIL when torch differs from the one torch_npu is
    built for (`undefined symbol` at import), WARN when CANN does (EH9999 or a missing kernel at the first
    operator), SKIP for a torch_npu release the table does not list."""
    name = "ascend-versions"
    row = TORCH_NPU_RELEASES.get(npu_version)
    if row is None:
        return CheckResult(name, SKIP, f"torch_npu {npu_version} is not in npudist's release table (Ascend/pytorch "
                           "COMPATIBILITY.en.md); compare torch and CANN with that table by hand")
    want_torch, want_cann = row
    fix = (f"install a released set (Ascend/pytorch COMPATIBILITY.en.md): torch {want_torch} + torch_npu "
           f"{npu_version} + CANN {want_cann}, or the torch_npu release built for the torch and CANN you have")
    torch_ok = _base_version(torch_version) == _base_version(want_torch)
    comparable = cann is not None and _CANN_RELEASE.fullmatch(cann) is not None
    cann_ok = not comparable or cann.upper() == want_cann.upper()
    found = f"torch {torch_version}, torch_npu {npu_version}, CANN {cann or 'unknown'}"
    if not torch_ok:
        return CheckResult(name, FAIL, f"{found}: torch_npu {npu_version} is built for torch {want_torch} "
                           "(import fails with `undefined symbol`)", fix)
    if not cann_ok:
        return CheckResult(name, WARN, f"{found}: torch_npu {npu_version} is built for CANN {want_cann} (a "
                           "mismatch fails at the first operator: EH9999, aclnn kernel not found)", fix)
    if not comparable:
        return CheckResult(name, OK, f"{found}: torch matches; the CANN version could not be compared "
                           f"(torch_npu {npu_version} is built for CANN {want_cann})")
    return CheckResult(name, OK, f"{found}: a released combination")


@check("ascend-versions")
def ascend_versions(host: Host) -> CheckResult:
    import torch

    if _stand_in() or importlib.util.find_spec("torch_npu") is None:
        return CheckResult("ascend-versions", SKIP, "torch_npu not installed (or npudist's simulated stand-in)")
    try:
        npu_version = importlib.metadata.version("torch_npu")
    except importlib.metadata.PackageNotFoundError:
        return CheckResult("ascend-versions", SKIP, "torch_npu has no package metadata to read its version from")
    home = host.env.get("ASCEND_HOME_PATH") or host.env.get("ASCEND_TOOLKIT_HOME")
    cann = cann_version(Path(home)) if home and Path(home).is_dir() else None
    return version_triad(torch.__version__, npu_version, cann)


# CANN environment-variable reference (envref_07_0077, CANN 8.x): HCCL_CONNECT_TIMEOUT is an integer in
# [120, 7200], default 120 s, and the real wait is the value + 20 s. HCCL_EXEC_TIMEOUT (CANN 6.0.1
# tfmigr1_000071): default 1800 s, range [68, 17340], effective value rounded down to a multiple of 68.
_HCCL_TIMEOUTS = (
    ("HCCL_CONNECT_TIMEOUT", 120, 120, 7200, "link set-up between devices; 120 s is too short for "
     "clusters of hundreds of NPUs, where 600-1800 s is common"),
    ("HCCL_EXEC_TIMEOUT", 1800, 68, 17340, "how long a device waits for peers inside a collective "
     "(e.g. while rank 0 alone writes a checkpoint)"),
)


def _ascend_host(host: Host) -> bool:
    """Signs of an Ascend host: CANN configured, npu-smi on PATH, torch_npu installed or the simulated NPU."""
    return bool(host.env.get("ASCEND_HOME_PATH") or host.env.get("NPUDIST_SIMULATE") or host.which("npu-smi")
                or (importlib.util.find_spec("torch_npu") is not None and not _stand_in()))


@check("hccl-timeouts")
def hccl_timeouts(host: Host) -> list[CheckResult]:
    out = []
    for var, default, low, high, effect in _HCCL_TIMEOUTS:
        raw = host.env.get(var, "").strip()
        if not raw and not _ascend_host(host):
            out.append(CheckResult(var, SKIP, f"n/a: no NPU on this host ({var} applies to HCCL jobs)"))
        elif not raw:
            out.append(CheckResult(var, OK, f"{var} unset: default {default} s ({effect})"))
        elif not raw.isdigit():
            out.append(CheckResult(var, FAIL, f"{var}={raw!r} is not an integer number of seconds",
                                   f"set an integer in [{low}, {high}]"))
        elif not low <= int(raw) <= high:
            out.append(CheckResult(var, FAIL, f"{var}={raw} is outside [{low}, {high}]: HCCL rejects it",
                                   f"set an integer in [{low}, {high}]"))
        else:
            out.append(CheckResult(var, OK, f"{var}={raw} s ({effect})"))
    return out
