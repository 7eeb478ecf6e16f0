"""A package's public names loaded on first use (PEP 562), so importing one submodule - for a command's
--help, a table - does not import everything the package re-exports (numpy, prometheus_client, torch)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: ``where`` maps each public name to the module that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(where[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups find it without coming back here
        return value

    return __getattr__
