"""Which accelerator this process should use: detected once per Runtime, without initialising a device."""

from __future__ import annotations

from npudist.accelerators.accelerator import Accelerator
from npudist.accelerators.probe import why_unavailable
from npudist.accelerators.vendors import BY_NAME, VENDORS
from npudist.runtime.state import current


class AcceleratorUnavailable(RuntimeError):
    """A forced or requested accelerator cannot be used here; the message says why."""


def get(name: str) -> Accelerator:
    """The accelerator called ``name``, or AcceleratorUnavailable saying why it cannot be used."""
    vendor = BY_NAME.get(name)
    if vendor is None:
        raise AcceleratorUnavailable(f"unknown accelerator {name!r}; choose one of {', '.join(BY_NAME)}")
    reason = why_unavailable(vendor)
    if reason is not None:
        raise AcceleratorUnavailable(f"accelerator {name!r} is not available: {reason}")
    return Accelerator(vendor)


def accelerator() -> Accelerator:
    """The best available accelerator (npu, cuda, mlu, rknpu, cpu), or the one NPUDIST_ACCELERATOR names,
    or the simulated NPU under NPUDIST_SIMULATE."""
    rt = current()
    acc = rt.accelerator
    if acc is None:
        acc = rt.accelerator = _detect(rt.settings.forced_accelerator)
    return acc


def _detect(forced: str | None) -> Accelerator:
    if forced:
        return get(forced)
    for vendor in VENDORS:
        if why_unavailable(vendor) is None:
            return Accelerator(vendor)
    raise AssertionError("the cpu row is always available")  # pragma: no cover

