"""The doctor's checks: one function each, registered in order; each reads only the Host it is given."""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import io
import platform
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult

Check = Callable[[Host], "CheckResult | list[CheckResult]"]
CHECKS: list[tuple[str, Check]] = []

GIB = 1 << 30
SHM_MIN_BYTES = GIB
NOFILE_MIN = 65536


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
    from npudist import backend_guard

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


def parse_toolkit_version(text: str) -> str | None:
    """`version=8.0.RC1` from ascend_toolkit_install.info, or `Version=...` from version.info/version.cfg."""
    match = re.search(r"^\s*(?:version|Version)\s*=\s*\[?([^\]\s:]+)", text, re.MULTILINE)
    return match.group(1) if match else None


_TOOLKIT_VERSION_FILES = ("*-linux/ascend_toolkit_install.info", "version.info", "version.cfg")


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
    version = None
    for pattern in _TOOLKIT_VERSION_FILES:
        for f in sorted(home_path.glob(pattern)):
            version = parse_toolkit_version(f.read_text(errors="replace"))
            if version:
                break
        if version:
            break
    shown = f"CANN {version}" if version else "CANN version unknown (no version file found)"
    if not has_runtime:
        return CheckResult("ascend-env", FAIL, f"{shown} at {home}, but no LD_LIBRARY_PATH entry holds "
                           "libascendcl.so", fix_source)
    return CheckResult("ascend-env", OK, f"{shown} at {home}; runtime libraries on LD_LIBRARY_PATH")


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


@check("shm")
def shm(host: Host) -> CheckResult:
    path = host.path("/dev/shm")
    if not path.exists():
        return CheckResult("shm", SKIP, "/dev/shm does not exist here")
    size = host.fs_size(path)
    finding = f"/dev/shm is {size / GIB:.2f} GiB"
    if size < SHM_MIN_BYTES:
        return CheckResult("shm", WARN, finding + " (gloo/NCCL fail in containers with the 64 MiB default)",
                           "docker run --shm-size=8g (or --ipc=host); Kubernetes: mount an emptyDir "
                           "with medium: Memory at /dev/shm")
    return CheckResult("shm", OK, finding)


@check("open-files")
def open_files(host: Host) -> CheckResult:
    soft, hard = host.nofile()
    finding = f"open-files limit {soft} (hard {hard})"
    if soft == -1 or soft >= NOFILE_MIN:
        return CheckResult("open-files", OK, finding)
    finding += f", below {NOFILE_MIN}: each rank holds sockets to its peers plus data-loader files"
    # `ulimit -n` can raise the soft limit only up to the hard one; past it takes root (limits.conf,
    # systemd LimitNOFILE=, the container runtime's --ulimit).
    raise_hard = (f"the hard limit is {hard}: as root raise nofile to {NOFILE_MIN} in /etc/security/limits.conf "
                  f"(or systemd LimitNOFILE=, docker run --ulimit nofile={NOFILE_MIN}:{NOFILE_MIN}), log in again")
    if hard != -1 and hard < NOFILE_MIN:
        fix = raise_hard + f", then ulimit -n {NOFILE_MIN}"
        if soft < hard:
            fix = f"ulimit -n {hard} now; for {NOFILE_MIN}, " + fix
        return CheckResult("open-files", WARN, finding, fix)
    return CheckResult("open-files", WARN, finding, f"ulimit -n {NOFILE_MIN} (the hard limit {hard} allows it)")


@check("master-addr")
def master_addr(host: Host) -> list[CheckResult]:
    addr = host.env.get("MASTER_ADDR", "").strip()
    port = host.env.get("MASTER_PORT", "").strip()
    out = []
    if not addr:
        out.append(CheckResult("master-addr", SKIP, "MASTER_ADDR not set (torchrun/npudist launch set it)"))
    else:
        try:
            ips = host.resolve(addr)
            out.append(CheckResult("master-addr", OK, f"MASTER_ADDR={addr} resolves to {', '.join(ips)}"))
        except OSError as exc:
            out.append(CheckResult("master-addr", FAIL, f"MASTER_ADDR={addr} does not resolve: {exc}",
                                   "use the IP address of rank 0's host, or fix DNS//etc/hosts"))
    if not port:
        out.append(CheckResult("master-port", SKIP, "MASTER_PORT not set"))
    elif not port.isdigit() or not 0 < int(port) < 65536:
        out.append(CheckResult("master-port", FAIL, f"MASTER_PORT={port!r} is not a TCP port", "use 1-65535"))
    else:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", int(port)))
                out.append(CheckResult("master-port", OK, f"MASTER_PORT={port} is free on this host"))
            except OSError:
                out.append(CheckResult("master-port", WARN, f"MASTER_PORT={port} is in use on this host",
                                       "if rank 0 runs here, pick another port or stop the process holding it"))
    return out


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


def _nccl_style_match(spec: str, names: list[str]) -> list[str]:
    """NCCL_SOCKET_IFNAME rules: comma list of prefixes, '=' for exact names, '^' to exclude."""
    exclude = spec.startswith("^")
    body = spec.lstrip("^")
    exact = body.startswith("=")
    wanted = [w for w in body.lstrip("=").split(",") if w]

    def hit(n: str) -> bool:
        return any(n == w if exact else n.startswith(w) for w in wanted)

    return [n for n in names if hit(n) != exclude]


@check("network-interfaces")
def network_interfaces(host: Host) -> list[CheckResult]:
    env = host.env
    if not any(env.get(k) for k in ("HCCL_IF_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")):
        return [CheckResult("network-interfaces", SKIP, "HCCL_IF_IP, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME unset")]
    ifaces = host.interfaces()
    out = []
    if env.get("HCCL_IF_IP"):
        ip = env["HCCL_IF_IP"].strip()
        owners = [n for n, addrs in ifaces.items() if ip in addrs]
        out.append(CheckResult("HCCL_IF_IP", OK, f"HCCL_IF_IP={ip} is on {owners[0]}") if owners else
                   CheckResult("HCCL_IF_IP", FAIL, f"HCCL_IF_IP={ip} is not an address of this host "
                               f"(have {', '.join(a for v in ifaces.values() for a in v)})",
                               "set HCCL_IF_IP to this host's address on the training network"))
    for var, matcher in (("NCCL_SOCKET_IFNAME", _nccl_style_match),
                         ("GLOO_SOCKET_IFNAME", lambda s, names: [n for n in names if n in s.split(",")])):
        spec = env.get(var, "").strip()
        if not spec:
            continue
        matched = matcher(spec, sorted(ifaces))
        out.append(CheckResult(var, OK, f"{var}={spec} selects {', '.join(matched)}") if matched else
                   CheckResult(var, FAIL, f"{var}={spec} matches no interface (have {', '.join(sorted(ifaces))})",
                               f"set {var} to one of the interfaces listed"))
    return out


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


def parse_nvidia_apps(text: str) -> list[tuple[int, str]]:
    """`nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader` -> [(pid, name)]."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0].strip().isdigit():
            rows.append((int(row[0].strip()), row[1].strip()))
    return rows


def _npu_processes(host: Host, exe: str) -> list[tuple[int, str]]:
    from npudist.telemetry.sources import npu_smi

    return [(p.pid, p.name or "?") for p in npu_smi.parse_processes(host.run([exe, "info"], host.tool_timeout))]


def _nvidia_processes(host: Host, exe: str) -> list[tuple[int, str]]:
    return parse_nvidia_apps(host.run([exe, "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                                      host.tool_timeout))


_PROCESS_LISTERS = (("npu-smi", _npu_processes), ("nvidia-smi", _nvidia_processes))


@check("device-processes")
def device_processes(host: Host) -> list[CheckResult]:
    out = []
    for tool, lister in _PROCESS_LISTERS:
        name = f"processes:{tool}"
        exe = host.which(tool)
        if not exe:
            out.append(CheckResult(name, SKIP, f"{tool} not on PATH"))
            continue
        try:
            procs = lister(host, exe)
        except Exception as exc:  # a vendor tool printing garbage must not stop the doctor
            out.append(CheckResult(name, WARN, f"could not read {tool}'s process table: {exc}",
                                   f"run `{tool}` by hand to see what it prints"))
            continue
        if procs:
            shown = ", ".join(f"{pid} ({pname})" for pid, pname in procs[:8])
            out.append(CheckResult(name, WARN, f"{len(procs)} process(es) hold devices: {shown}",
                                   "stop them (kill PID) before starting a job, or it fails with 'device busy'"))
        else:
            out.append(CheckResult(name, OK, f"no process holds a device ({tool})"))
    return out


# Flight recorders: a ring buffer of recent collectives per rank, dumped when a collective times out.
# NCCL: PyTorch "ProcessGroupNCCL Environment Variables" (TORCH_NCCL_TRACE_BUFFER_SIZE must be > 0 for
# TORCH_NCCL_DUMP_ON_TIMEOUT to dump). HCCL: torch_npu mirrors them under TORCH_HCCL_* (torchtitan-npu
# docs/feature_guides/metrics_and_debugging.md, "HCCL Flight Recorder").
_FLIGHT_RECORDERS = (
    ("nccl", "cuda", MappingProxyType({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/nccl_trace_rank_"})),
    ("hccl", "npu", MappingProxyType({"TORCH_HCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_HCCL_DUMP_ON_TIMEOUT": "1",
                                      "HCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_HCCL_ENABLE_MONITORING": "1",
                                      "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": "/tmp/hccl_trace_rank_"})),
)


@check("flight-recorder")
def flight_recorder(host: Host) -> list[CheckResult]:
    from npudist.accelerators import BY_NAME, why_unavailable

    out = []
    for backend, vendor, wanted in _FLIGHT_RECORDERS:
        name = f"flight-recorder:{backend}"
        size_var = next(iter(wanted))
        size = host.env.get(size_var, "").strip()
        enabled = size.isdigit() and int(size) > 0
        fix = "export " + " ".join(f"{k}={v}" for k, v in wanted.items())
        if enabled:
            missing = [k for k in wanted if k != size_var and not host.env.get(k)]
            note = f" (also consider {', '.join(missing)})" if missing else ""
            out.append(CheckResult(name, OK, f"{size_var}={size}: {backend} records recent collectives{note}"))
        elif why_unavailable(BY_NAME[vendor]) is None:
            out.append(CheckResult(name, WARN, f"{backend}'s flight recorder is off: a hang leaves no trace of "
                                   "which collective each rank reached", fix))
        else:
            out.append(CheckResult(name, SKIP, f"no {vendor} device here; to trace {backend} hangs: {fix}"))
    return out


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
