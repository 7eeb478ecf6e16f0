"""Device sources by name, imported lazily so a missing vendor module costs nothing until asked for."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

from npudist.telemetry.sources.readings import Source

# name -> "module:Class". Names match the vendor table's `telemetry_source` column (accelerators/vendors.py).
SOURCES: Mapping[str, str] = MappingProxyType({
    "npu-smi": "npudist.telemetry.sources.npu_smi:NpuSmiSource",
    "rknpu": "npudist.telemetry.sources.rknpu_sysfs:RknpuSource",
    "nvml": "npudist.telemetry.sources.nvml:NvmlSource",
    "cpu": "npudist.telemetry.sources.host_psutil:HostSource",
})


class SourceUnavailable(RuntimeError):
    """A named device source cannot be loaded here; the message says why and what to use instead."""


def resolve_name(name: str) -> str:
    """``auto`` -> the detected accelerator's telemetry source; other names pass through."""
    if name != "auto":
        return name
    from npudist.accelerators import VENDORS, accelerator, backend_guard

    broken = backend_guard.from_env()
    if broken is not None:  # the vendor's Python runtime does not load, but its node tool may still read the cards
        vendor = next((v for v in VENDORS if v.module == broken.extension), None)
        if vendor is not None:
            return vendor.telemetry_source
    return accelerator().vendor.telemetry_source


def load_source(name: str) -> Source:
    """An instance of the source called ``name`` (a SOURCES key, ``auto``, or ``package.module:Class``)."""
    resolved = resolve_name(name)
    target = SOURCES.get(resolved, resolved if ":" in resolved else None)
    if target is None:
        detected = f" (auto detected {resolved!r})" if name == "auto" else ""
        raise SourceUnavailable(f"unknown telemetry source {resolved!r}{detected}; choose one of auto, "
                                f"{', '.join(SOURCES)}, or give package.module:Class")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceUnavailable(f"telemetry source {resolved!r} needs module {module_name!r}, which "
                                f"cannot be imported: {exc}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise SourceUnavailable(f"telemetry source {resolved!r}: {module_name} has no class {cls_name!r}")
    try:
        return cls()
    except Exception as exc:
        raise SourceUnavailable(
            f"telemetry source {resolved!r} failed to start: {type(exc).__name__}: {exc}") from None
