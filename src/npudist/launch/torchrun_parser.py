"""torchrun's own argument parser, built from torch's installed source without importing torch.

`npudist launch --help` shows torchrun's options as the installed torch defines them; importing
torch.distributed.run to get them costs seconds (torch itself). torch/distributed/run.py's
``get_args_parser`` only builds an argparse parser: it is compiled here from that file, with the names it
uses read from argparse, torch/distributed/argparse_util.py (the ``env``/``check_env`` actions: argparse and
os only) and, for an Enum it imports for ``choices`` (torch 2.9+: numa AffinityMode), that class's
definition in its own file. A torch whose file this reading does not follow is imported instead.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import enum
import importlib.util
import os
from pathlib import Path
from typing import Any

_FUNCTION = "get_args_parser"


def _torch_root() -> Path:
    spec = importlib.util.find_spec("torch")  # a top-level name: found without running torch/__init__.py
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _definitions(path: Path, names: set[str], scope: dict[str, Any]) -> dict[str, Any]:
    """Run only the top-level class/function definitions called ``names`` in ``path``, in ``scope``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    body = [n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name in names]
    if {n.name for n in body} != names:
        raise LookupError(f"{path} does not define {sorted(names - {n.name for n in body})}")
    space = dict(scope)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), space)  # definitions only
    return {name: space[name] for name in names}


def _imported(tree: ast.Module, root: Path, wanted: set[str]) -> dict[str, Any]:
    """The ``wanted`` names run.py takes from other torch modules, each read from its defining file."""
    scope: dict[str, Any] = {"os": os, "Action": argparse.Action, "Enum": enum.Enum}
    found: dict[str, Any] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.")):
            continue
        for alias in node.names:
            local = alias.asname or alias.name
            if local not in wanted:
                continue
            base = root.joinpath(*node.module.split(".")[1:])
            path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            found[local] = _definitions(path, {alias.name}, scope)[alias.name]
    return found


def _from_source() -> argparse.ArgumentParser:
    root = _torch_root()
    path = root / "distributed" / "run.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == _FUNCTION)
    scope: dict[str, Any] = {"ArgumentParser": argparse.ArgumentParser, "REMAINDER": argparse.REMAINDER,
                             "os": os, "__name__": "torch.distributed.run"}
    local = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    local |= {a.arg for n in ast.walk(function) if isinstance(n, ast.arguments) for a in n.args}
    local |= {n.name for n in ast.walk(function) if isinstance(n, ast.FunctionDef)}
    used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    wanted = used - local - set(scope) - set(dir(builtins))
    scope.update(_imported(tree, root, wanted))
    if missing := wanted - set(scope):
        raise LookupError(f"{path}: {_FUNCTION} uses {sorted(missing)}")
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(path), "exec"), scope)
    return scope[_FUNCTION]()


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's parser as torch.distributed.run.get_args_parser() returns it."""
    try:
        return _from_source()
    except Exception:  # any torch whose source reads otherwise: the real import answers
        from torch.distributed.run import get_args_parser

        return get_args_parser()
