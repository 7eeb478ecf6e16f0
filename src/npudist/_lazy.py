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

import importlib.abc
import importlib.machinery
import importlib.util
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


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module paths that still import, for one release, as the very module at the new place.

    ``moved`` maps each old dotted path to the new one. It comes last on ``sys.meta_path``, so only a path
    that no longer exists reaches it; ``import old`` then binds the new module under the old name (one
    object: a monkeypatch or an isinstance check through either path agrees). No file is left at the old
    place, so a moved top-level module does not count among the package's loose modules.
    """

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = moved
        self._specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        module = import_module(self.moved[spec.name])
        self._specs[spec.name] = module.__spec__  # the import system sets __spec__ to the old name's: undone below
        return module

    def exec_module(self, module: Any) -> None:
        real = self._specs.pop(module.__spec__.name, None)
        if real is not None:
            module.__spec__ = real


def install_moved(moved: Mapping[str, str]) -> None:
    """Put a MovedModules for ``moved`` at the end of ``sys.meta_path`` (once per table)."""
    if not any(isinstance(f, MovedModules) and f.moved is moved for f in sys.meta_path):
        sys.meta_path.append(MovedModules(moved))
