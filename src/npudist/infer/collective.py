"""The one place npudist.infer talks to other ranks: npudist.comm.all_reduce, which stages through
host memory where the device requires it (RK3588) and adapts to the backend's constraints, on the
device the group's backend takes (npudist.comm.control.device): members answer and headers start on
the host, and HCCL or NCCL groups refuse host tensors."""

from __future__ import annotations

from types import MappingProxyType

import torch
import torch.distributed as dist

_OPS = MappingProxyType({"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT})


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
    from npudist.comm import all_reduce, control

    on_group = tensor.to(control.device())  # the same tensor, no copy, where the group serves the host
    all_reduce(on_group, op=op)
    return on_group if on_group is tensor else on_group.to(tensor.device)

