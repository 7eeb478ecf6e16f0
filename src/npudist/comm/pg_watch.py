"""The process-group watch: every collective on every process group of this process, counted per group.

npudist's own collectives are only part of what a job issues: FSDP2's all-gathers and reduce-scatters,
DTensor's redistributions, DDP's buckets, a script's raw ``dist.all_reduce``, on the default group, on
``new_group`` subgroups and on DeviceMesh dimensions, never pass through npudist.comm. Every one of them
passes through torch's dispatcher as a c10d op (or a functional collective), so a small C++ kernel on the
Autograd keys (native/pg_watch.cpp) counts each call per group, with its completion from the call's Work,
for a few atomic increments on the caller's thread (benchmarks/pg_watch_cost.py). The watchdog thread reads
the counters once a period (``snapshot()``) and publishes them in the rank's record (watchdog.py).

A Python kernel on the same keys would cost the caller tens of microseconds per call (the arguments are
boxed into Python objects and back), so the kernel is built here, once per torch, with the host's C++
compiler and torch's own headers, and cached (``NPUDIST_CACHE_DIR``, else ``~/.cache/npudist``). Without a
compiler, or with ``NPUDIST_PG_WATCH=off``, the watch is off and only npudist's own collectives are numbered
(what npudist did before; ``npudist doctor`` says so).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

from npudist.runtime import native

log = logging.getLogger("npudist.comm")
SOURCE = str(Path(__file__).with_name("native") / "pg_watch.cpp")
CACHE_VAR = native.CACHE_VAR
MEASURED_UP_TO = (2, 13)
"""The newest torch the kernel was built and run against (with compat.FEATURES' oldest, its range): a newer
c10d may change what the kernel relies on (boxed c10d ops, Work futures), so it waits to be measured."""
BUILD_TIMEOUT_S = 600.0
"""A cold build of the kernel takes 10-30 s on a 2-core host; a compiler that hangs must not hang a rank."""


class _Load:
    """The one load of this process: process-wide like the kernels the dispatcher holds once loaded (a
    second load of the library would register them twice), so not a Runtime's to own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = False
        self.error: str | None = None


_LOAD = _Load()


class WatchUnavailable(RuntimeError):
    """The native watch cannot be built or loaded here; the message says why and what to do."""


@dataclass(frozen=True)
class GroupCount:
    """One process group's calls on this rank, as the kernel counted them."""

    name: str
    """torch's group name (what functional collectives resolve; the same on every member)."""
    entered: int
    """Collectives entered on this group (point-to-point apart): the group's sequence number."""
    done: int
    p2p_entered: int
    p2p_done: int
    op: str
    """The last collective's op (``all_reduce``, ``_allgather_base``...)."""
    nbytes: int
    since: float
    """Wall time the last collective began."""

    @property
    def in_flight(self) -> bool:
        return self.entered > self.done or self.p2p_entered > self.p2p_done


@dataclass(frozen=True)
class WatchSnapshot:
    total: int
    """Every call counted, all groups: grows whenever the rank issues one."""
    waits: int
    """Functional collectives' waits in progress (wait_tensor): the rank is waiting inside one."""
    groups: tuple[GroupCount, ...] = field(default_factory=tuple)
    busy_s: float = 0.0
    """Seconds during which at least one collective was in flight on this rank, since the watch was loaded."""

    @property
    def waiting(self) -> bool:
        return self.waits > 0 or any(g.in_flight for g in self.groups)

    def current(self) -> GroupCount | None:
        """The call the rank waits in (the oldest still in flight), else its last one."""
        flying = [g for g in self.groups if g.in_flight]
        if flying:
            return min(flying, key=lambda g: g.since)
        started = [g for g in self.groups if g.entered]
        return max(started, key=lambda g: g.since) if started else None


TORCH_NAMES = MappingProxyType({
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced", "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor", "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base": "reduce_scatter_tensor", "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
    "recv_any_source": "recv"})
"""A c10d op's name as torch.distributed's API names it, which the user's script and npudist's verdicts use."""


def _op_name(raw: str) -> str:
    """``c10d::allreduce_`` -> ``all_reduce``; ``c10d::_allgather_base_`` -> ``all_gather_into_tensor``."""
    name = raw.split("::", 1)[-1].rstrip("_") or raw
    return TORCH_NAMES.get(name, name)


def parse(table: torch.Tensor, names: list[str], ops: list[str]) -> WatchSnapshot:
    """The kernel's counters (``snapshot()``'s int64 table: a header row, then one row per group) as records."""
    rows = table.tolist()
    head = rows[0] if rows else [0, -1, 0, 0, 0]
    groups = []
    for i, row in enumerate(rows[1:]):
        entered, done, p_in, p_done, op, nbytes, since_ns = row[:7]
        groups.append(GroupCount(name=names[i] if i < len(names) else f"slot{i}", entered=entered, done=done,
                                 p2p_entered=p_in, p2p_done=p_done,
                                 op=_op_name(ops[op]) if 0 <= op < len(ops) else "", nbytes=nbytes,
                                 since=since_ns / 1e9))
    return WatchSnapshot(total=head[0], waits=head[2], groups=tuple(groups), busy_s=head[4] / 1e9)


def snapshot() -> WatchSnapshot:
    ops = torch.ops.npudist_watch
    return parse(ops.snapshot(), list(ops.names()), list(ops.op_names()))


def busy_seconds() -> float:
    """Seconds this rank has had a collective in flight (any group, any caller): what a step timer subtracts
    from the step so that skew compares work, not the wait for the slowest rank. One call into the library."""
    return float(torch.ops.npudist_watch.busy_seconds())


def reset() -> None:
    """Forget the groups: a new process group in this process starts its counts from zero."""
    torch.ops.npudist_watch.reset()


# -- building and loading --------------------------------------------------------------------------------

def library_path(env: dict[str, str] | None = None) -> Path:
    """Where this torch's build of the kernel lives: one per torch build, C++ ABI, interpreter and source."""
    tag = f"torch{torch.__version__.replace('+', '-')}-{native.build_key(Path(SOURCE))[:12]}"
    return native.cache_dir(env) / "pg_watch" / tag / "libnpudist_pg_watch.so"


def unsupported() -> str | None:
    """Why this torch goes without the watch (it was not measured on it), or None."""
    from npudist.runtime import compat

    if not compat.has("pg_watch") or compat.TORCH[:2] > MEASURED_UP_TO:
        return (f"the process-group watch has been measured on torch 2.13 only; this is torch {torch.__version__} "
                "(only npudist's own collectives are numbered here)")
    return None


def build(env: dict[str, str] | None = None) -> Path:
    """Build the kernel for this torch unless it is built (one process builds, the others wait on a lock)."""
    why = unsupported()
    if why is not None:
        raise WatchUnavailable(why)
    path = library_path(env)
    if path.exists():
        return path
    cxx = native.compiler()
    if cxx is None:
        raise WatchUnavailable("no C++ compiler (c++, g++ or $CXX) to build the process-group watch; install one "
                               "(apt-get install g++) or set NPUDIST_PG_WATCH=off")
    if not (Path(torch.__file__).parent / "include" / "torch" / "library.h").exists():
        raise WatchUnavailable("this torch ships no C++ headers (torch/include); the process-group watch cannot be "
                               "built against it")
    try:
        return native.build_library(Path(SOURCE), path, cxx=cxx, libs=("c10", "torch_cpu", "torch"),
                                    timeout_s=BUILD_TIMEOUT_S)
    except native.BuildFailed as exc:
        raise WatchUnavailable(f"building the process-group watch with {cxx} failed: {exc}") from exc


def load() -> bool:
    """Build (first time only) and load the watch; True when every collective of this process is counted.
    Never raises: a watch that cannot be had leaves hang diagnosis to npudist's own collectives (logged once)."""
    with _LOAD.lock:
        if _LOAD.ok or _LOAD.error is not None:
            return _LOAD.ok
        try:
            torch.ops.load_library(str(build()))
            _LOAD.ok = True
            return True
        except Exception as exc:  # a missing compiler, headers or symbol must never stop a rank
            _LOAD.error = f"{type(exc).__name__}: {exc}"
            log.warning("npudist: the process-group watch is off (%s); hangs in collectives that npudist did "
                        "not issue (FSDP2, DTensor, raw torch.distributed) are named only by the collective "
                        "timeout", str(exc).splitlines()[0][:300])
            return False


def loaded() -> bool:
    """Whether load() succeeded in this process (the kernel counts every collective)."""
    return _LOAD.ok


def why_off() -> str | None:
    """Why load() failed in this process, or None."""
    return _LOAD.error


def dispatched(group: Any) -> bool:
    """Whether ``group``'s collectives pass through torch's dispatcher, where the watch counts them: a group
    torch builds (gloo, NCCL, HCCL through torch_npu) does; a ProcessGroup implemented in Python is called
    straight from Python and never reaches the c10d ops, so its collectives keep npudist's own numbering
    (watchdog.py), unless it says it hands them to a dispatched group (``collectives_dispatched``: the
    simulated hccl, sim/hccl.py)."""
    return type(group) is dist.ProcessGroup or getattr(group, "collectives_dispatched", False) is True
