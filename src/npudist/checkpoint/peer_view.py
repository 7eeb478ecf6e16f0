"""The consistent view a peer snapshot takes, split between the training thread and the stager's.

Between a snapshot and the next optimizer step, the tensors an optimizer owns (its parameters and its
state, on the host) change only in that step, which waits for their copy (peer.py's pre-hook); so the
training thread need not touch them. What else may change before the stager gets to it (a buffer a
forward updates, a device tensor, a mutable object) is copied at the call. Finding those leaves takes a
walk over the whole state, about 60 µs of Python for the example's 112 tensors, which is the whole budget
of a snapshot at K = 1 (issue 46: 1 % of a 6.4 ms step). So the stager walks, and remembers the paths of
those leaves as a *plan*; the next call copies only the leaves at the plan's paths, and the stager checks
that nothing outside the plan needed copying (a copy that misses a leaf is dropped, and the plan is
corrected for the next call). The first call, and any call whose plan no longer fits the state, copies
every leaf that is not the optimizers' at the call, as a snapshot did before.

The state's containers are read on the stager thread, so the caller passes fresh ones (as
``model.state_dict()`` and ``optimizer.state_dict()`` are) and leaves them alone until the next step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

Path = tuple[Hashable, ...]
"""Keys and indices from the root of the state to one leaf; () is the whole state."""

ATOMIC = frozenset({int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device, torch.Size})
"""Leaves nothing can change in place: kept as they are, never copied."""


def at(state: Any, path: Path) -> Any:
    """The object at ``path``; LookupError or TypeError when the state no longer has it."""
    for key in path:
        state = state[key]
    return state


def owned_storages(optimizers: list[torch.optim.Optimizer]) -> set[int]:
    """Storages of the host tensors these optimizers change in their step: their parameters and state."""
    out: set[int] = set()
    for opt in optimizers:
        tensors = [p for g in opt.param_groups for p in g["params"]]
        tensors += [v for st in opt.state.values() if isinstance(st, dict) for v in st.values()]
        out.update(t.untyped_storage().data_ptr() for t in tensors
                   if isinstance(t, torch.Tensor) and t.device.type == "cpu")
    out.discard(0)
    return out


@dataclass(frozen=True)
class Walk:
    owned: list[torch.Tensor]
    """The optimizers' tensors in the state (one per tensor object), to copy before their next step."""
    plan: tuple[Path, ...]
    """Paths of the leaves to copy at the call: not the optimizers', and not atomic."""
    missed: tuple[Path, ...]
    """Those of ``plan`` no copy made at the call covers: the view is not consistent there."""


def walk(state: Any, early: dict[Path, Any], storages: set[int]) -> Walk:
    """Classify every leaf of ``state``; ``early`` holds the copies made at the call, by path."""
    owned: dict[int, torch.Tensor] = {}
    plan: list[Path] = []
    missed: list[Path] = []

    def visit(obj: Any, path: Path, covered: bool) -> None:
        covered = covered or path in early
        if type(obj) in ATOMIC:
            return
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu" and obj.untyped_storage().data_ptr() in storages:
                if not covered:
                    owned.setdefault(id(obj), obj)
                return
        elif isinstance(obj, dict):
            for k, v in obj.items():
                visit(v, (*path, k), covered)
            return
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                visit(v, (*path, i), covered)
            return
        plan.append(path)
        if not covered:
            missed.append(path)

    visit(state, (), False)
    return Walk(list(owned.values()), tuple(plan), tuple(missed))


def assemble(state: Any, early: dict[Path, Any], copies: Callable[[torch.Tensor, Path], Any]) -> Any:
    """``state`` with containers rebuilt, the copies made at the call at their paths, each optimizer-owned
    tensor replaced by ``copies(tensor, path)``, and the atomic leaves kept."""

    def build(obj: Any, path: Path) -> Any:
        if path in early:
            return early[path]
        if isinstance(obj, torch.Tensor):
            return copies(obj, path)
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the class and attributes (a state_dict's _metadata)
            for k, v in obj.items():
                out[k] = build(v, (*path, k))
            return out
        if isinstance(obj, list):
            return [build(v, (*path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(build(v, (*path, i)) for i, v in enumerate(obj))
        return obj

    return build(state, ())
