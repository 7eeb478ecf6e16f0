"""How many ranks this node runs: one per device of the accelerator (`auto`), and never more ranks than
devices on a backend that needs one device per rank."""

from __future__ import annotations

from collections.abc import Mapping

from npudist.accelerators import Accelerator
from npudist.launch.errors import LaunchError
from npudist.launch.errors import settings as _settings


def resolve_nproc(value: str | None, acc: Accelerator, env: Mapping[str, str]) -> int:
    """`auto` (or nothing) -> one rank per device; on CPU 2 ranks unless NPUDIST_CPU_NPROC says otherwise."""
    if value not in (None, "auto"):
        if not str(value).isdigit() or int(value) < 1:
            raise LaunchError(f"--nproc-per-node {value!r}: give a positive integer or 'auto'")
        return int(value)
    if acc.vendor.default_nproc is not None:
        wanted = _settings(env).cpu_nproc if acc.device_type == "cpu" else None
        return wanted or acc.vendor.default_nproc
    count = acc.device_count()
    if count < 1:
        raise LaunchError(f"--nproc-per-node auto: {acc.name} reports no devices; pass a number instead")
    return count


ONE_DEVICE_PER_RANK = frozenset({"nccl", "hccl", "cncl"})
"""Backends whose ranks each need a device of their own: NCCL refuses two ranks on one GPU ("Duplicate GPU
detected", NCCL's init.cc), and HCCL and CNCL bind one communicator rank to one device likewise."""


def visible_devices(acc: Accelerator, env: Mapping[str, str]) -> int | None:
    """Devices the ranks of this node can use, or None when that cannot be known here (then nothing is
    refused). The simulated NPU shows the chips a real host would: its ASCEND_RT_VISIBLE_DEVICES list, else
    NPUDIST_SIM_CHIPS."""
    if acc.vendor.simulated:
        listed = [c for c in env.get(acc.vendor.visible_devices_var or "", "").split(",") if c.strip()]
        return len(listed) or _settings(env).sim_chips
    try:
        return int(acc.device_count())
    except Exception:  # a vendor runtime that cannot count here: the ranks will say what is wrong
        return None


def check_devices(nproc: int, acc: Accelerator, env: Mapping[str, str]) -> None:
    """More ranks than devices on a one-device-per-rank backend is refused before any rank starts."""
    if acc.vendor.backend not in ONE_DEVICE_PER_RANK:
        return
    found = visible_devices(acc, env)
    if found is None or nproc <= found:
        return
    var = acc.vendor.visible_devices_var
    shown = f" ({var}={env[var]!r})" if var and var in env else ""
    fixes = [f"--nproc-per-node {found}" if found else "a host with a device"]
    if var:
        fixes.append(f"make more devices visible with {var}")
    fixes.append("--accelerator cpu to run the ranks on the CPU over gloo")
    raise LaunchError(
        f"--nproc-per-node {nproc} asks for {nproc} ranks on this node, but {acc.name} shows {found} device"
        f"{'' if found == 1 else 's'}{shown}, and {acc.vendor.backend} needs one device per rank (two ranks on "
        f"one device fail inside the collective library). Fix: {'; or '.join(fixes)}.")
