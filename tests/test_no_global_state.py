"""No module-level mutable state outside the Runtime: every npudist module's globals, checked.

Each module is imported and every name its own source assigns at module level is looked up in
``vars(module)``. Dicts, lists, sets and instances of ordinary classes are mutable; read-only
mappings (MappingProxyType), frozensets, tuples of immutable values, frozen dataclasses of immutable
fields, functions, classes and the like are constants. What remains must be in ALLOWED, with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import decimal
import enum
import importlib
import logging
import pkgutil
import re
import threading
import types
import typing
from pathlib import Path

import pytest
import torch
import torch.distributed

import npudist
from npudist.runtime import state as runtime_state
from npudist.runtime.settings import Settings

ALLOWED = {
    "npudist.runtime.state._current":
        "the holder of the current Runtime: the one piece of process state that is not inside the Runtime",
    "npudist.runtime.state._start_lock": "guards _current so two threads cannot start two Runtimes",
    "npudist.doctor.checks.CHECKS": "registry filled by @check as the module is imported, read-only afterwards",
    "npudist.cli.app": "typer app: the CLI's command table, built at import",
    "npudist.cli.err": "rich Console on stderr: an output stream, holds no state between commands",
    "npudist.dashboards.cli.app": "typer app: the `npudist dashboards` command table, built at import",
    "npudist.dashboards.cli.err": "rich Console on stderr: an output stream",
    "npudist.deploy.cli.app": "typer app: the `npudist deploy` command table, built at import",
    "npudist.deploy.cli.err": "rich Console on stderr: an output stream",
    "npudist.migrate.cli.app": "typer app: the `npudist migrate` command table, built at import",
    "npudist.migrate.cli.err": "rich Console on stderr: an output stream",
    "npudist.edge.cli.app": "typer app: the `npudist edge` command table, built at import",
    "npudist.edge.cli.err": "rich Console on stderr: an output stream",
    "npudist.ranktable.cli.app": "typer app: the `npudist ranktable` command table, built at import",
    "npudist.ranktable.cli.err": "rich Console on stderr: an output stream",
    "npudist.bench.cli.app": "typer app: the `npudist bench` command table, built at import",
    "npudist.ops.activations.swish": "custom operator defined in torch.library at import (torch's dispatcher is "
                                     "process-wide); its kernel table mirrors what is registered there",
    "npudist.ops.activations.swish_backward": "as swish",
    "npudist.sim.state.SIM": "the simulated NPU's driver state (bytes held, collectives run, installed row): "
                             "process-wide like the torch registries it plugs into, which outlive a Runtime",
    "npudist.comm.pg_watch._LOAD": "whether the process-group watch's kernels are loaded: the dispatcher holds "
                                   "them for the process's life (loading twice registers them twice)",
    "npudist.report.svg._DEC": "decimal Context: precision and exponent range for axis ticks; only its unused "
                               "flags ever change",
}

_CONSTANT_TYPES = (int, float, complex, decimal.Decimal, str, bytes, bool, type(None), range, type, types.FunctionType,
                   types.BuiltinFunctionType, types.ModuleType, re.Pattern, torch.dtype, torch.device, enum.Enum,
                   logging.Logger, frozenset, types.UnionType, typing.TypeVar, property, staticmethod,
                   types.GenericAlias, torch.distributed.ReduceOp.RedOpType)


def mutable(value: object) -> bool:
    if isinstance(value, _CONSTANT_TYPES) or type(value).__module__ == "typing":
        return False
    if isinstance(value, tuple):
        return any(mutable(v) for v in value)
    if isinstance(value, types.MappingProxyType):
        return any(mutable(v) for v in value.values())
    if dataclasses.is_dataclass(value):
        return not value.__dataclass_params__.frozen or any(
            mutable(getattr(value, f.name)) for f in dataclasses.fields(value))
    return True


def _assigned_names(module: types.ModuleType) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names - {"__all__"}  # the export list: read by `import *` and tools, never written


def mutable_globals() -> set[str]:
    runtime_state.current()  # so the holder holds something and is checked
    found = set()
    for info in pkgutil.walk_packages(npudist.__path__, "npudist."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in _assigned_names(module):
            if name in vars(module) and mutable(vars(module)[name]):
                found.add(f"{info.name}.{name}")
    return found


def test_module_globals_are_constants_or_allowed():
    found = mutable_globals()
    assert found - ALLOWED.keys() == set(), "module-level mutable state: move it into the Runtime or make it constant"
    assert ALLOWED.keys() - found == set(), "allow-list entries that no longer exist: remove them"


@pytest.mark.parametrize(("value", "expected"), [
    ({}, True), ([], True), (set(), True), (threading.Lock(), True),
    (runtime_state.Runtime(Settings()), True), ((1, []), True),
    (types.MappingProxyType({"a": []}), True),
    (types.MappingProxyType({"a": (1, "x")}), False), (frozenset({1}), False), ((torch.float32, "x"), False),
    (Settings(), False), (torch.device("cpu"), False),
])
def test_the_mutability_check_itself(value, expected):
    assert mutable(value) is expected
