"""The one place npudist.infer talks to other ranks.

Uses the collectives issue's ``npudist.comm.all_reduce`` when it is importable (it knows which devices
must stage through host memory); until then, torch.distributed with the same staging rule. After the
merge the fallback branch can go.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT}


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when no process group exists, so one process is an ensemble of one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` over all ranks and return the result (every rank gets the same values)."""
    if op not in _OPS:
        raise ValueError(f"all_reduce op {op!r}: choose one of {', '.join(_OPS)}")
    if world()[1] == 1:
        return tensor
    try:
        from npudist.comm import all_reduce  # type: ignore[import-not-found]
    except ImportError:
        all_reduce = None
    if all_reduce is not None:
        out = all_reduce(tensor, op=op)
        return out if isinstance(out, torch.Tensor) else tensor
    from npudist.accelerators import accelerator

    # RK3588 has no collective library (vendor row stage_through_cpu); gloo reduces host memory only.
    if tensor.device.type != "cpu" and (accelerator().stage_through_cpu or dist.get_backend() == "gloo"):
        host = tensor.cpu()
        dist.all_reduce(host, op=_OPS[op])
        tensor.copy_(host)
        return tensor
    dist.all_reduce(tensor, op=_OPS[op])
    return tensor
