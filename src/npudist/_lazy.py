"""A package's public names loaded on first use (PEP 562), so importing one submodule - for a command's
--help, a table - does not import everything the package re-exports (numpy, prometheus_client, torch).

Every package that defers its names uses this one helper::

    _WHERE = MappingProxyType({"Settings": "npudist.runtime.settings", "constraints": ("npudist.comm",
                                                                                      "active_constraints")})
    __getattr__ = exports(__name__, _WHERE)
    __dir__ = listing(__name__, _WHERE)

A value is the module that defines the name, or ``(module, attribute)`` where the public name differs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any

Where = Mapping[str, str | tuple[str, str]]


def _source(name: str, place: str | tuple[str, str]) -> tuple[str, str]:
    return (place, name) if isinstance(place, str) else place


def exports(package: str, where: Where, *, submodules: Iterable[str] = ()) -> Callable[[str], Any]:
    """The package's ``__getattr__``: ``where`` maps each public name to the module that defines it (or to
    ``(module, attribute)``); ``submodules`` are imported as ``package.name`` on first attribute access."""
    subs = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in where:
            module, attribute = _source(name, where[name])
            value = getattr(import_module(module), attribute)
        elif name in subs:
            value = import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # later lookups find it without coming back here
        return value

    return __getattr__


def listing(package: str, where: Where, *, submodules: Iterable[str] = ()) -> Callable[[], list[str]]:
    """The package's ``__dir__``: what is loaded already plus every name ``exports`` can load."""
    names = frozenset({*where, *submodules})

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __dir__
