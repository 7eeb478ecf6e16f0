"""Per-group facts a collective needs on every call, looked up once and cached.

The environment (NPUDIST_COMM_PROFILE, NPUDIST_COMM_DEBUG, NPUDIST_COMM_SYNC_TIMING) is read when a
group is first used; ``set_profile``/``set_debug`` change it in-process and drop the cache.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from npudist.comm import constraints as _constraints
from npudist.comm.constraints import Constraints

DEBUG_VAR = "NPUDIST_COMM_DEBUG"
SYNC_VAR = "NPUDIST_COMM_SYNC_TIMING"

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class GroupContext:
    backend: str
    world: int
    rank: int
    constraints: Constraints
    debug: bool
    sync_timing: bool
    device_type: str
    """Device type of the accelerator in use (for synchronising before timing)."""
    fast_reduce: dict[str, frozenset[torch.dtype]]
    """Reduce op -> dtypes all_reduce hands straight to torch.distributed (given a contiguous tensor where
    the row asks for one): worked out once here so the per-call check is one set lookup."""


def _fast_reduce(c: Constraints, debug: bool) -> dict[str, frozenset[torch.dtype]]:
    if debug or not c.device_tensors or c.element_multiple != 1 or c.alignment_bytes != 1:
        return {}
    return {op: c.native_dtypes(op) for op in _constraints.REDUCE_OPS}


def _default_group() -> object | None:
    """The default process group, or None; the cheap way where torch has it (called on every collective)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "default_pg"):
        return world.default_pg
    return dist.group.WORLD if dist.is_initialized() else None


_cache: dict[object, GroupContext] = {}
_debug_override: bool | None = None


def set_debug(on: bool | None) -> None:
    """Turn the cross-rank size handshake on or off in-process (None: back to NPUDIST_COMM_DEBUG)."""
    global _debug_override
    _debug_override = on
    _cache.clear()


def set_profile(name: str | None) -> None:
    """Apply a constraint profile in-process (None: back to NPUDIST_COMM_PROFILE / the backend's row)."""
    _constraints.set_profile(name)
    _cache.clear()


def get(group: object | None) -> GroupContext:
    """The cached context of ``group`` (None: the default group); RuntimeError before init()."""
    key = group if group is not None else _default_group()
    ctx = _cache.get(key)
    if ctx is not None:
        return ctx
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "npudist collectives need a process group: call npudist.init() first "
            "(start the job with `npudist launch` or torchrun)"
        )
    from npudist.accelerators import accelerator

    debug = _debug_override
    if debug is None:
        debug = os.environ.get(DEBUG_VAR, "").strip().lower() in _TRUE
    c = _constraints.constraints(group)
    ctx = GroupContext(
        backend=str(dist.get_backend(group)),
        world=dist.get_world_size(group),
        rank=dist.get_rank(group),
        constraints=c,
        debug=debug,
        sync_timing=os.environ.get(SYNC_VAR, "").strip().lower() in _TRUE,
        device_type=accelerator().device_type,
        fast_reduce=_fast_reduce(c, debug),
    )
    _cache[key] = ctx
    return ctx


def forget() -> None:
    """Drop cached contexts (after a process group is destroyed and created again).

    Also run at exit: the cache keys hold process groups, and a gloo group that lives into interpreter
    finalization can abort the process (see npudist.shutdown) when the user destroyed it themselves.
    """
    _cache.clear()


atexit.register(forget)
