"""Pure planning: what a tensor needs before a backend with given constraints accepts it.

No I/O and no process group here, so every rule can be unit-tested on plain dtypes and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from npudist.comm.constraints import FLOATS, WIDER, Constraints


@dataclass(frozen=True, slots=True)
class Plan:
    work_dtype: torch.dtype
    """dtype handed to the library."""
    chunk: int
    """Caller's elements per chunk (the whole tensor, or one rank's share for reduce_scatter)."""
    padded_chunk: int
    """Elements of work_dtype per chunk handed to the library (chunk plus padding)."""
    kinds: tuple[str, ...]
    """Adaptations applied, for the accounting (cast, contiguous, pad, align, stage)."""
    copy: bool
    """A scratch buffer is needed (any adaptation but none)."""
    stage: bool
    """The scratch buffer lives in host memory."""
    native_op: str
    """Op passed to the library ("sum" when "avg" is emulated)."""
    divide: bool
    """Divide by the world size after the library call (emulated avg)."""
    reinterpret: bool = False
    """Movement only: the bytes travel as work_dtype without a value conversion."""


class TensorFacts(NamedTuple):
    """What planning needs of a tensor, read off it once by the caller so that this module stays pure."""

    dtype: torch.dtype
    numel: int
    contiguous: bool = True
    data_ptr: int = 0
    """Its address, for the alignment rule (0 satisfies every alignment)."""
    device_type: str = "cpu"

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorFacts:
        return cls(t.dtype, t.numel(), t.is_contiguous(), t.data_ptr(), t.device.type)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _names(dtypes: frozenset[torch.dtype]) -> str:
    return "{" + ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes)) + "}"


def reduce_dtype(c: Constraints, op: str, dtype: torch.dtype, backend: str) -> tuple[torch.dtype, str, bool]:
    """(dtype to reduce in, native op, divide afterwards) or TypeError naming what is supported."""
    native_op, divide = op, False
    if op not in c.reduce_dtypes and op == "avg":
        if dtype not in FLOATS:
            raise TypeError(
                f"all_reduce op='avg' on {dtype} is not supported on backend {backend} (profile "
                f"{c.name!r}): avg needs a floating-point tensor; convert it first or reduce with 'sum'"
            )
        native_op, divide = "sum", True
    allowed = c.native_dtypes(native_op)
    if dtype in allowed:
        return dtype, native_op, divide
    for wider in WIDER.get(dtype, ()):
        if wider in allowed:
            return wider, native_op, divide
    raise TypeError(
        f"op={op!r} on {dtype} is not supported on backend {backend} (profile {c.name!r}): it reduces "
        f"{_names(allowed) if allowed else 'no dtype'} with {native_op!r}, and no wider one of those holds "
        f"every {str(dtype).removeprefix('torch.')} value exactly. Use a supported dtype or another op."
    )


def plan_reduce(c: Constraints, op: str, t: TensorFacts, *, chunks: int = 1, backend: str = "") -> Plan:
    """Adaptations for a reduction of ``t`` split into ``chunks`` equal chunks."""
    work, native_op, divide = reduce_dtype(c, op, t.dtype, backend or c.name)
    return _finish(c, t, work, chunks=chunks, native_op=native_op, divide=divide)


def plan_copy(c: Constraints, t: TensorFacts, *, backend: str = "") -> Plan:
    """Adaptations for moving data (broadcast, all_gather): unsupported dtypes travel as raw bytes."""
    if t.dtype in c.copy_dtypes:
        return _finish(c, t, t.dtype)
    if not c.copy_dtypes:
        raise TypeError(f"backend {backend or c.name} (profile {c.name!r}) moves no dtype at all")
    itemsize = _itemsize(t.dtype)
    same = [d for d in c.copy_dtypes if _itemsize(d) == itemsize]
    # Same width first (no padding), else the narrowest supported one (least padding).
    work = min(same or c.copy_dtypes, key=lambda d: (_itemsize(d), str(d)))
    return _finish(c, t, work, reinterpret=True)


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty((), dtype=dtype).element_size()


def _finish(c: Constraints, t: TensorFacts, work: torch.dtype, *, chunks: int = 1, native_op: str = "",
            divide: bool = False, reinterpret: bool = False) -> Plan:
    """The Plan of handing ``t`` to the library as ``work`` under the row ``c``."""
    dtype, contiguous, data_ptr, device_type = t.dtype, t.contiguous, t.data_ptr, t.device_type
    chunk = t.numel // chunks if chunks else t.numel
    work_chunk = -(-chunk * _itemsize(dtype) // _itemsize(work)) if reinterpret else chunk
    padded = _round_up(work_chunk, c.element_multiple) if c.element_multiple > 1 else work_chunk
    kinds: list[str] = []
    if work != dtype:
        kinds.append("cast")
    if c.contiguous and not contiguous:
        kinds.append("contiguous")
    if padded != work_chunk or (reinterpret and work_chunk * _itemsize(work) != chunk * _itemsize(dtype)):
        kinds.append("pad")
    stage = not c.device_tensors and device_type != "cpu"
    if stage:
        kinds.append("stage")
    if not kinds and c.alignment_bytes > 1 and data_ptr % c.alignment_bytes:
        # Any copy lands in an aligned buffer, so alignment costs a copy only when nothing else did.
        kinds.append("align")
    return Plan(work_dtype=work, chunk=chunk, padded_chunk=padded, kinds=tuple(kinds), copy=bool(kinds),
                stage=stage, native_op=native_op, divide=divide, reinterpret=reinterpret)


def neutral(op: str, dtype: torch.dtype) -> float | int | bool:
    """The value that leaves a reduction unchanged: what padding holds."""
    if op in ("sum", "avg", "bor", "bxor"):
        return 0
    if op == "product":
        return 1
    if dtype == torch.bool:
        return {"max": False, "min": True, "band": True}[op]
    if dtype.is_floating_point:
        return {"max": float("-inf"), "min": float("inf")}[op]
    info = torch.iinfo(dtype)
    return {"max": info.min, "min": info.max, "band": -1 if info.min < 0 else info.max}[op]
