"""Accelerator families as data, with uniform calls over what torch dispatches.

The names load on first use: the vendor table (vendors.py) is plain data that deploy and the CLI's help
read without importing torch; Accelerator and detection import it.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npudist.accelerators.accelerator import Accelerator
    from npudist.accelerators.detect import AcceleratorUnavailable, accelerator, get
    from npudist.accelerators.probe import why_unavailable
    from npudist.accelerators.vendors import BY_NAME, VENDORS, Vendor

# Public name -> the module under npudist.accelerators that defines it.
_EXPORTS: Mapping[str, str] = MappingProxyType({
    "Accelerator": "accelerator", "AcceleratorUnavailable": "detect", "accelerator": "detect", "get": "detect",
    "why_unavailable": "probe", "BY_NAME": "vendors", "VENDORS": "vendors", "Vendor": "vendors",
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


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'npudist.accelerators' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"npudist.accelerators.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """Keeps ``accelerator`` the public function: importing the submodule accelerator.py would bind the
    module under that name (the import system sets a loaded submodule on its package)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not (name == "accelerator" and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
