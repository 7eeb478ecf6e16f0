"""Accelerator families as data, with uniform calls over what torch dispatches.

The names load on first use: the vendor table (vendors.py) is plain data that deploy and the CLI's help
read without importing torch; Accelerator and detection import it.
"""

from __future__ import annotations

import sys
import types
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from npudist._lazy import exports, listing

if TYPE_CHECKING:
    from npudist.accelerators.accelerator import Accelerator
    from npudist.accelerators.detect import AcceleratorUnavailable, accelerator, get
    from npudist.accelerators.probe import why_unavailable
    from npudist.accelerators.vendors import BY_NAME, VENDORS, Vendor

_WHERE = MappingProxyType({
    "Accelerator": "npudist.accelerators.accelerator",
    "AcceleratorUnavailable": "npudist.accelerators.detect",
    "accelerator": "npudist.accelerators.detect",
    "get": "npudist.accelerators.detect",
    "why_unavailable": "npudist.accelerators.probe",
    "BY_NAME": "npudist.accelerators.vendors",
    "VENDORS": "npudist.accelerators.vendors",
    "Vendor": "npudist.accelerators.vendors",
})

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


__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)


class _Package(types.ModuleType):
    """Keeps ``accelerator`` the public function: importing the submodule accelerator.py would bind the
    module under that name (the import system sets a loaded submodule on its package)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not (name == "accelerator" and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
