"""The one door for npudist's own control messages: flags, small objects, rows of numbers and barriers.

Checkpoints agree on failures, the run-dir lock tells every rank its outcome, the step timer exchanges
window means, shutdown meets at a barrier: each is a collective of a few bytes on the job's group. The
group's backend decides where those bytes must live. A backend registered for device types only (HCCL
for ``npu``, NCCL for ``cuda``, CNCL for ``mlu``) refuses a CPU tensor ("No backend type associated
with device type cpu"), so the door puts them on the group's device; a group that serves ``cpu``
(gloo, or ``cpu:gloo,cuda:nccl``) gets host tensors and no copy.

Why device tensors rather than a gloo side group for control data: the device group already exists,
a flag costs one host-to-device copy and one read back, and nothing more is held per rank. A gloo side
group over the whole job is another rendezvous at start and a full mesh of TCP connections (N - 1 per
rank, O(N^2) per job): at 8,192 ranks, 8,191 sockets per rank to carry a few bytes at each checkpoint.
The one gloo group npudist does make is ``side_group()``, for DCP's background writes, whose
collectives must not interleave with the training loop's on the default group; it is created at the
first sharded asynchronous save, once per job, and dropped with the Runtime.

These messages are not counted by the recorder: they are npudist's bookkeeping, not the training job's
traffic (``npudist.comm.stats()``). Nor are they numbered by the watchdog while they succeed; one on the
job's group that fails (a peer's node lost while the others wait at a checkpoint) is numbered then and
diagnosed like a training collective: every live rank fails in it and numbers it, a lost one cannot, so
the verdict names the lost ranks and their node instead of leaving the backend's bare error. The
checkpoint's agreement, where the other ranks wait while rank 0 writes, is numbered while it runs
(``numbered=True``), so a peer cut off without an error (a partitioned node) is found there too.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from npudist.comm import context
from npudist.comm.buffers import aligned_empty
from npudist.comm.state import state
from npudist.comm.watched import communication_failure
from npudist.runtime.compat import DIST_ERRORS

log = logging.getLogger("npudist.comm")
CPU = torch.device("cpu")
SHUTDOWN_BARRIER_S = 30.0


def distributed() -> bool:
    """True once a process group exists (control messages are then collectives)."""
    return dist.is_available() and dist.is_initialized()


def rank(group: Any = None) -> int:
    """This process's rank in ``group``; 0 without a process group."""
    return dist.get_rank(group) if distributed() else 0


def device(group: Any = None) -> torch.device:
    """Where ``group``'s backend takes control tensors: the CPU when it serves ``cpu``, else the current
    device of the first device type it is registered for (the one ``init()`` bound the communicator to).

    The device types come from the group (``ProcessGroup._device_types``, which torch's own object
    collectives read) or, for a backend whose group does not list them (a Python process group), from
    the ``devices=`` it was registered with (``Backend.backend_capability``).
    """
    pg = group if group is not None else dist.group.WORLD
    types = [d.type for d in getattr(pg, "_device_types", ())]
    if not types:
        types = list(dist.Backend.backend_capability.get(str(dist.get_backend(group)).lower(), ()))
    if not types or "cpu" in types:
        return CPU
    return torch.device(types[0])  # no index: the current device of that type


def _diagnosed(op: str, group: Any, call: Callable[[], Any], numbered: bool = False) -> Any:
    """``call()``; a communication failure on the job's group, on the main thread (whose record the
    watchdog keeps; DCP's background writes use the side group), becomes CollectiveHangError. With
    ``numbered`` the call is numbered while it runs, as a training collective is, so the hang reader
    also sees ranks waiting in it for a peer that will never come (a partitioned node sends no error)."""
    watched = group is None and threading.current_thread() is threading.main_thread()
    watchdog = state().watchdog
    seq = watchdog.enter(op, 0) if watched and numbered else 0
    try:
        out = call()
    except DIST_ERRORS as exc:
        if not watched or not communication_failure(exc):
            raise
        err = watchdog.diagnose(op, seq or watchdog.enter(op, 0), 0, exc)
        if err is None:
            raise
        raise err from exc
    if seq:
        watchdog.done(seq)
    return out


def any_rank(flag: bool, group: Any = None) -> bool:
    """True on every rank when ``flag`` is set on any rank (a MAX all-reduce of one element)."""
    if not distributed():
        return bool(flag)
    t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=device(group))
    _diagnosed("control all_reduce", group, lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group))
    return bool(t.item())


def first_rank(flag: bool, group: Any = None, *, numbered: bool = False) -> int | None:
    """The lowest rank of ``group`` whose ``flag`` is set, on every rank; None when no rank set it (a MIN
    all-reduce of one element). ``numbered``: the hang watchdog numbers it (a wait the job can hang in)."""
    if not distributed():
        return 0 if flag else None
    world = dist.get_world_size(group)
    t = torch.tensor([dist.get_rank(group) if flag else world], dtype=torch.int32, device=device(group))
    _diagnosed("control all_reduce", group, lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group), numbered)
    first = int(t.item())
    return first if first < world else None


def min_int(value: int, group: Any = None) -> int:
    """The smallest ``value`` over the ranks of ``group``, on every rank (a MIN all-reduce of one int64)."""
    if not distributed():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


def max_int(value: int, group: Any = None) -> int:
    """The largest ``value`` over the ranks of ``group``, on every rank (a MAX all-reduce of one int64)."""
    return -min_int(-int(value), group)


def swap_text(topic: str, text: str, peer: int, timeout: timedelta = timedelta(seconds=120)) -> str:
    """Publish this rank's ``text`` under ``topic`` and return rank ``peer``'s: O(1) per rank, through the
    process group's store (small values only), so no rank gathers the whole job's. Every rank must call
    it; without a process group the text comes back. The store's prefix is per torchrun attempt, so a
    restarted job never reads a value of the attempt before it."""
    if not distributed():
        return text
    from npudist.comm.hang.store import shared_store

    store = shared_store()
    if store is None:
        raise RuntimeError("no process group store to exchange control text through")
    store.set(f"npudist/swap/{topic}/{dist.get_rank()}", text)
    key = f"npudist/swap/{topic}/{peer}"
    store.wait([key], timeout)
    return store.get(key).decode()


def from_rank(flag: bool, src: int = 0, group: Any = None) -> bool:
    """Rank ``src``'s ``flag``, on every rank (a broadcast of one element)."""
    if not distributed():
        return bool(flag)
    t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=device(group))
    _diagnosed("control broadcast", group, lambda: dist.broadcast(t, src=src, group=group))
    return bool(t.item())


def broadcast_object(obj: Any, src: int = 0, group: Any = None, *, numbered: bool = False) -> Any:
    """Rank ``src``'s ``obj`` (picklable; only trusted npudist values), on every rank (``numbered``: see
    first_rank)."""
    if not distributed():
        return obj
    box = [obj]
    _diagnosed("control broadcast", group,
               lambda: dist.broadcast_object_list(box, src=src, group=group, device=device(group)), numbered)
    return box[0]


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (picklable; only trusted npudist values, small: a failure path's findings), by
    rank, on every rank."""
    if not distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    _diagnosed("control all_gather", group, lambda: dist.all_gather_object(out, obj, group=group))
    return out


def gather_rows(row: list[float], group: Any = None) -> tuple[list[list[float]], int]:
    """Every rank's ``row`` (equal lengths, float32 on the wire), by rank, and this rank's index."""
    if not distributed():
        return [list(row)], 0
    # The row's element-count multiple and alignment (hccl-strict: 128 elements, 128 bytes) hold for each
    # buffer, as for any adapted collective: padded with zeros, read back without the padding.
    c = context.get(group).constraints
    n = len(row)
    padded = -(-max(n, 1) // c.element_multiple) * c.element_multiple
    dev = device(group)
    mine = aligned_empty(padded, torch.float32, dev, c.alignment_bytes)
    mine.zero_()
    mine[:n] = torch.tensor(row, dtype=torch.float32)
    out = [aligned_empty(padded, torch.float32, dev, c.alignment_bytes) for _ in range(dist.get_world_size(group))]
    _diagnosed("control all_gather", group, lambda: dist.all_gather(out, mine, group=group))
    return [t[:n].cpu().tolist() for t in out], dist.get_rank(group)


def barrier(timeout: timedelta, group: Any = None) -> None:
    """Wait until every rank of ``group`` arrives. On a group that serves the CPU this is gloo's
    ``monitored_barrier``, which names a rank that never came within ``timeout``; on device groups it
    is an all-reduce of one element (``dist.barrier`` there guesses a device when none is bound, and
    not every device backend implements it), bounded by the group's own timeout."""
    _diagnosed("control barrier", group, lambda: _barrier(timeout, group))


def _barrier(timeout: timedelta, group: Any) -> None:
    if not distributed() or dist.get_world_size(group) == 1:
        return
    if device(group).type == "cpu" and str(dist.get_backend(group)) == "gloo":
        dist.monitored_barrier(group=group, timeout=timeout)
        return
    t = torch.zeros(1, dtype=torch.int32, device=device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)


def side_group() -> Any:
    """A gloo group over the whole job for collectives issued from a background thread (DCP's
    asynchronous sharded writes), so they never interleave with the training loop's on the default
    group (torchtitan does the same). Collective: every rank calls it at the same point; created once
    per Runtime and dropped when it closes."""
    st = state()
    if st.side_group is None:
        st.side_group = dist.new_group(backend="gloo")
    return st.side_group


def end_group() -> None:
    """Destroy the default process group (after the bounded shutdown barrier, unless an exception is on
    its way out and a peer may be gone), so that no rank destroys its group while a peer's last
    collective is still in flight."""
    if not distributed():
        return
    if sys.exc_info()[0] is None:
        try:
            _barrier(timedelta(seconds=SHUTDOWN_BARRIER_S), None)
        except Exception as exc:  # a peer that already left must not turn shutdown into an error nor a report
            log.debug("shutdown barrier failed: %s", exc)
    dist.destroy_process_group()
