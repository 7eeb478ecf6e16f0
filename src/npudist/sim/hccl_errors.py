"""HCCL's words for a refusal: its result codes (HcclResult in hccl_types.h, CANN; shipped in the torch-npu
wheel), the error torch_npu raises when a call returns one, and the reduce ops by name."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch.distributed as dist

HCCL_E_PARA = "HCCL_E_PARA"
HCCL_E_NOT_SUPPORT = "HCCL_E_NOT_SUPPORT"
RESULT_CODES = MappingProxyType({HCCL_E_PARA: 1, HCCL_E_NOT_SUPPORT: 5})

OP_NAMES = MappingProxyType({
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "product", dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.AVG: "avg", dist.ReduceOp.BAND: "band", dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
})


class HcclError(RuntimeError):
    """What torch_npu raises when an HCCL call returns an error code."""


def op_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return OP_NAMES.get(getattr(op, "op", op), str(op))
