"""Per-group facts a collective needs on every call, looked up once and cached in the CommState.

A group's entry is built from the Runtime's Settings (NPUDIST_COMM_PROFILE, NPUDIST_COMM_DEBUG,
NPUDIST_COMM_SYNC_TIMING, read when the Runtime started) on its first collective; ``set_profile`` and
``set_debug`` (state.py) override them in-process and drop the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from npudist.accelerators import accelerator
from npudist.comm import constraints as _constraints
from npudist.comm.buffers import BufferPool
from npudist.comm.constraints import Constraints
from npudist.comm.recorder import Recorder
from npudist.comm.state import active_constraints, state


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
    recorder: Recorder
    """The CommState's recorder and pool, carried here so a call reaches them in one attribute."""
    pool: BufferPool


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


def get(group: object | None) -> GroupContext:
    """The cached context of ``group`` (None: the default group); RuntimeError before init()."""
    st = state()
    key = group if group is not None else _default_group()
    ctx = st.groups.get(key)
    if ctx is not None:
        return ctx
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "npudist collectives need a process group: call npudist.init() first "
            "(start the job with `npudist launch` or torchrun)"
        )
    debug = st.debug if st.debug is not None else st.settings.comm_debug
    c = active_constraints(group)
    ctx = GroupContext(
        backend=str(dist.get_backend(group)),
        world=dist.get_world_size(group),
        rank=dist.get_rank(group),
        constraints=c,
        debug=debug,
        sync_timing=st.settings.sync_timing,
        device_type=accelerator().device_type,
        fast_reduce=_fast_reduce(c, debug),
        recorder=st.recorder,
        pool=st.pool,
    )
    st.groups[key] = ctx
    return ctx
