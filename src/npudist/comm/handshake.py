"""Debug-mode check that every rank passes the same tensor layout, before the real collective.

Backends do not agree on what a size mismatch does: gloo aborts the process in a C++ CHECK for
reduce_scatter, NCCL and HCCL may hang or read past a buffer. One fixed-size all_gather of a few
integers per call turns that into an error naming the ranks and their shapes.
"""

from __future__ import annotations

import torch

from npudist.comm.flat_gather import all_gather_flat

_MAX_DIMS = 8
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool)


class MismatchError(RuntimeError):
    """Ranks passed tensors of different sizes or dtypes to the same collective."""


def _code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES) + hash(str(dtype)) % 1000


def describe_row(row: list[int]) -> str:
    numel, dtype_code, ndim = row[0], row[1], row[2]
    dtype = str(_DTYPES[dtype_code]).removeprefix("torch.") if dtype_code < len(_DTYPES) else "other"
    shape = row[3:3 + ndim] if ndim <= _MAX_DIMS else ["..."]
    return f"{numel} elements (shape {list(shape)}, {dtype})"


def check(op: str, numel: int, dtype: torch.dtype, shape: tuple[int, ...], group: object | None, world: int,
          device: torch.device) -> None:
    """Raise MismatchError on every rank when the ranks' (numel, dtype, shape) differ."""
    dims = list(shape[:_MAX_DIMS]) + [-1] * (_MAX_DIMS - min(len(shape), _MAX_DIMS))
    mine = torch.tensor([numel, _code(dtype), len(shape), *dims], dtype=torch.int64, device=device)
    every = torch.empty(world * mine.numel(), dtype=torch.int64, device=device)
    all_gather_flat(every, mine, group=group)
    rows = every.view(world, -1).tolist()
    if all(r == rows[0] for r in rows):
        return
    seen = "; ".join(f"rank {r} has {describe_row(row)}" for r, row in enumerate(rows))
    raise MismatchError(
        f"{op}: ranks passed different tensors ({seen}). Every rank must pass the same shape and dtype "
        "to a collective; find the rank whose tensor differs (uneven data split, a skipped layer)."
    )
