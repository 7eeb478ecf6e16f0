"""Which accelerator this process should use: detected once, without initialising a device."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

from npudist.accelerators.accelerator import Accelerator
from npudist.accelerators.vendors import BY_NAME, VENDORS, Vendor

FORCE_VAR = "NPUDIST_ACCELERATOR"


class AcceleratorUnavailable(RuntimeError):
    """A forced or requested accelerator cannot be used here; the message says why."""


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


@functools.cache
def why_unavailable(vendor: Vendor) -> str | None:
    """None when the vendor can be used in this process, else a one-line reason."""
    if vendor.module:
        reason = _import_reason(vendor.module)
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


def get(name: str) -> Accelerator:
    """The accelerator called ``name``, or AcceleratorUnavailable saying why it cannot be used."""
    vendor = BY_NAME.get(name)
    if vendor is None:
        raise AcceleratorUnavailable(f"unknown accelerator {name!r}; choose one of {', '.join(BY_NAME)}")
    reason = why_unavailable(vendor)
    if reason is not None:
        raise AcceleratorUnavailable(f"accelerator {name!r} is not available: {reason}")
    return Accelerator(vendor)


@functools.cache
def _detect(forced: str | None) -> Accelerator:
    if forced:
        return get(forced)
    for vendor in VENDORS:
        if why_unavailable(vendor) is None:
            return Accelerator(vendor)
    raise AssertionError("the cpu row is always available")  # pragma: no cover


def accelerator() -> Accelerator:
    """The best available accelerator (npu, cuda, mlu, rknpu, cpu), or the one NPUDIST_ACCELERATOR names."""
    return _detect(os.environ.get(FORCE_VAR, "").strip().lower() or None)


def report() -> list[tuple[str, str | None]]:
    """Every vendor with the reason it is unavailable (None when available), in detection order."""
    return [(v.name, why_unavailable(v)) for v in VENDORS]
