"""Doctor checks of what is already on the devices: processes holding them, and whether a hang would
leave a flight-recorder trace."""

from __future__ import annotations

import csv
import io
from types import MappingProxyType

from npudist.doctor.checks import check
from npudist.doctor.host import Host
from npudist.doctor.result import OK, SKIP, WARN, CheckResult


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
