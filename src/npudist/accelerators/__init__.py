"""Accelerator families as data, with uniform calls over what torch dispatches."""

from npudist.accelerators.accelerator import Accelerator
from npudist.accelerators.detect import AcceleratorUnavailable, accelerator, get
from npudist.accelerators.probe import why_unavailable
from npudist.accelerators.vendors import BY_NAME, VENDORS, Vendor

__all__ = [
    "BY_NAME",
    "VENDORS",
    "Accelerator",
    "AcceleratorUnavailable",
    "Vendor",
    "accelerator",
    "get",
    "why_unavailable",
]
