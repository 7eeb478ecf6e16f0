"""Whether one vendor row can be used in this process: checked without initialising a device.

Each answer is kept in the process's Runtime (a vendor package, once imported, stays imported), so a
vendor is probed once per Runtime.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from npudist.accelerators.vendors import Vendor
from npudist.runtime.state import current


def _import_reason(module: str) -> str | None:
    """Import a vendor package, returning why it failed instead of raising.

    Vendor packages fail in many ways (torch_npu without CANN raises at import, a torch mismatch
    raises OSError for an undefined symbol), so anything but an interrupt is caught.
    """
    if importlib.util.find_spec(module) is None:
        return f"Python package {module!r} is not installed"
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"importing {module!r} failed: {type(exc).__name__}: {exc}"
    return None


def why_unavailable(vendor: Vendor) -> str | None:
    """None when the vendor can be used in this process, else a one-line reason."""
    known = current().unavailable
    if vendor.name not in known:
        known[vendor.name] = _probe(vendor)
    return known[vendor.name]


def _probe(vendor: Vendor) -> str | None:
    if vendor.module:
        reason = _import_reason(vendor.module)
        if reason:
            return reason
    if vendor.activate is not None:
        module, _, function = vendor.activate.partition(":")
        reason = getattr(importlib.import_module(module), function)()
        if reason:
            return reason
    if vendor.board_probe is not None:
        return vendor.board_probe()
    if vendor.device_type == "cpu":
        return None
    mod = getattr(torch, vendor.device_type, None)
    if mod is None:
        return f"torch has no torch.{vendor.device_type} module"
    try:
        if not mod.is_available():
            return f"torch.{vendor.device_type}.is_available() is False (no driver or no device)"
        if mod.device_count() < 1:
            return f"torch.{vendor.device_type}.device_count() is 0"
    except Exception as exc:
        return f"torch.{vendor.device_type} failed: {type(exc).__name__}: {exc}"
    return None
