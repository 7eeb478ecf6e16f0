"""Per-group facts a collective needs on every call, looked up once and cached.

The environment (NPUDIST_COMM_PROFILE, NPUDIST_COMM_DEBUG, NPUDIST_COMM_SYNC_TIMING) is read when a
group is first used; ``set_profile``/``set_debug`` change it in-process and drop the cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
    key = group if group is not None else dist.group.WORLD
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
    ctx = GroupContext(
        backend=str(dist.get_backend(group)),
        world=dist.get_world_size(group),
        rank=dist.get_rank(group),
        constraints=_constraints.constraints(group),
        debug=debug,
        sync_timing=os.environ.get(SYNC_VAR, "").strip().lower() in _TRUE,
        device_type=accelerator().device_type,
    )
    _cache[key] = ctx
    return ctx


def forget() -> None:
    """Drop cached contexts (after a process group is destroyed and created again)."""
    _cache.clear()
