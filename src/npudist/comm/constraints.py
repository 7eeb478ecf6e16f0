"""What each collective backend accepts, as one data row per backend, and which row is active.

The collectives in this package read a row and do only the adaptation it demands; nothing here
branches on a vendor name. ``NPUDIST_COMM_PROFILE=<name>`` applies any row to whatever backend runs,
which is how the strict Ascend rules are exercised over gloo on a CPU (state.active_constraints() says
which row is in force).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

import torch
import torch.distributed as dist

from npudist.accelerators import accelerator
from npudist.runtime import compat
from npudist.runtime.settings import PROFILE_VAR

REDUCE_OPS = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
I8, I16, I32, I64, U8, BOOL = torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool
FLOATS = frozenset({F16, BF16, F32, F64})

# Wider dtypes that hold every value of the key exactly, narrowest first. Integers widen only to
# integers so wrap-around arithmetic stays the same modulo the narrow type once cast back.
WIDER: Mapping[torch.dtype, tuple[torch.dtype, ...]] = MappingProxyType({
    BOOL: (U8, I8, I16, I32, I64),
    U8: (I16, I32, I64),
    I8: (I16, I32, I64),
    I16: (I32, I64),
    I32: (I64,),
    F16: (F32, F64),
    BF16: (F32, F64),
    F32: (F64,),
})


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """What one backend (or a stricter named profile) accepts from a collective call."""

    name: str
    """Profile name users pass in NPUDIST_COMM_PROFILE."""
    reduce_dtypes: Mapping[str, frozenset[torch.dtype]]
    """Reduce op -> dtypes reduced natively. An op absent here has no native form ("avg" is then
    emulated as sum followed by a division)."""
    copy_dtypes: frozenset[torch.dtype]
    """Dtypes that broadcast/all_gather move as they are; others travel as the bytes of one of these."""
    contiguous: bool
    """Tensors must be dense and contiguous."""
    element_multiple: int = 1
    """The element count handed to the library must be a multiple of this."""
    alignment_bytes: int = 1
    """The data pointer handed to the library must be a multiple of this."""
    device_tensors: bool = True
    """Device tensors are accepted; False means they are staged through host memory."""
    source: str = ""
    """Where the row's facts come from."""
    avg_in_group: bool = False
    """The process group takes ReduceOp.AVG although the library has no avg: it reduces with sum and divides
    by the group size (torch_npu ProcessGroupHCCL, getHcclReduceOp, since Ascend/pytorch !17393, 2025-02).
    What the simulated hccl follows; npudist's own collectives emulate avg from reduce_dtypes either way."""

    def native_dtypes(self, op: str) -> frozenset[torch.dtype]:
        return self.reduce_dtypes.get(op, frozenset())


def _ops(table: dict[str, frozenset[torch.dtype]]) -> Mapping[str, frozenset[torch.dtype]]:
    return MappingProxyType(dict(table))


# gloo takes bfloat16 only on newer torch (runtime/compat.py, "gloo_bf16"); before, bf16 travels as float32.
_GLOO_ARITH = frozenset({F16, F32, F64, I8, U8, I32, I64, BOOL} | ({BF16} if compat.has("gloo_bf16") else set()))
_GLOO_INT = frozenset({I8, U8, I32, I64, BOOL})
_NCCL_ALL = frozenset({F16, BF16, F32, F64, I8, U8, I32, I64, BOOL})
_HCCL_ARITH = frozenset({F16, BF16, F32, I8, I16, I32, I64})
_CNCL_ARITH = frozenset({F16, F32, I8, I16, I32, U8})

GLOO = Constraints(
    name="gloo",
    # torch/csrc/distributed/c10d/ProcessGroupGloo.cpp: GENERATE_ALL_TYPES covers float, double, half,
    # bfloat16, int8, uint8, int32, int64 and bool ("Invalid scalar type" for int16, seen on torch 2.13);
    # BAND/BOR/BXOR raise "Cannot use ReduceOp.BAND with non-integral dtype"; AVG divides, so integer
    # AVG fails ("result type Float can't be cast").
    reduce_dtypes=_ops({
        "sum": _GLOO_ARITH, "max": _GLOO_ARITH, "min": _GLOO_ARITH, "product": _GLOO_ARITH,
        **({"avg": _GLOO_ARITH & frozenset({F16, BF16, F32, F64})} if compat.has("gloo_avg") else {}),
        "band": _GLOO_INT, "bor": _GLOO_INT, "bxor": _GLOO_INT,
    }),
    copy_dtypes=_GLOO_ARITH,
    # Gloo reads a tensor's storage as one flat run: a step-sliced view comes back with wrong values
    # and no error (found by tests/comm/test_collectives.py with 2 ranks on torch 2.13).
    contiguous=True,
    source="torch ProcessGroupGloo.cpp (torch 2.13), checked with 2 and 3 gloo ranks",
)

NCCL = Constraints(
    name="nccl",
    # NCCL ncclDataType_t / ncclRedOp_t (docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html):
    # int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16 (>= 2.10); sum, prod, max,
    # min, avg (>= 2.10); no bitwise ops. torch ProcessGroupNCCL.cpp getNcclDataType maps bool to uint8
    # (sum->max, product->min) and has no int16 entry; check_gpu_single_tensor: "Tensors must be contiguous".
    reduce_dtypes=_ops({
        "sum": _NCCL_ALL, "max": _NCCL_ALL, "min": _NCCL_ALL, "product": _NCCL_ALL,
        "avg": _GLOO_ARITH & frozenset({F16, BF16, F32, F64}),
    }),
    copy_dtypes=_NCCL_ALL,
    contiguous=True,
    source="NCCL API types page; torch ProcessGroupNCCL.cpp",
)

HCCL = Constraints(
    name="hccl",
    # CANN HcclAllReduce (Atlas A2/A3 training series): int8, int16, int32, int64, float16, float32, bfp16;
    # ops sum, prod, max, min (HcclReduceOp has no avg); prod not for bfp16 (nor int16). The types exist in
    # HcclDataType of hccl_types.h as shipped in the torch-npu 2.14.0 wheel
    # (torch_npu/include/third_party/hccl/inc/hccl/hccl_types.h: ..._BFP16 = 11; tests/comm/test_plan.py).
    # torch_npu ProcessGroupHCCL: device tensors, dense and contiguous (checkTensor), bool sent as uint8.
    reduce_dtypes=_ops({
        "sum": _HCCL_ARITH, "max": _HCCL_ARITH, "min": _HCCL_ARITH,
        "product": frozenset({F16, F32, I8, I32, I64}),
    }),
    copy_dtypes=frozenset({F16, BF16, F32, F64, I8, I16, I32, I64, U8, BOOL}),
    contiguous=True,
    source="CANN HcclAllReduce/HcclBroadcast pages (Atlas A2/A3); torch_npu ProcessGroupHCCL",
    # torch_npu ProcessGroupHCCL.cpp: getHcclReduceOp returns HCCL_REDUCE_SUM for AVG ("PTA supports it by
    # summing first, then dividing"), and the reductions divide by getSize() afterwards; its
    # checkSupportedDataType (checkSupportedDataTypeOfAllReduce before 2024-06) allows exactly the sum dtypes above.
    avg_in_group=True,
)

HCCL_STRICT = Constraints(
    name="hccl-strict",
    # First-generation Ascend 910 with old torch_npu releases, and field reports of HCCL_EINVAL/HCCL_EMEM:
    # float32/float16 only (bf16 rejected), element count a multiple of 128, data pointer 128-byte
    # aligned, contiguous only.
    reduce_dtypes=_ops({op: frozenset({F16, F32}) for op in ("sum", "max", "min", "product")}),
    copy_dtypes=frozenset({F16, F32}),
    contiguous=True,
    element_multiple=128,
    alignment_bytes=128,
    source="Ascend 910 (first generation) limits with old torch_npu; field reports",
)

CNCL = Constraints(
    name="cncl",
    # Cambricon CNCL developer guide, cnclDataType_t and cnclReduceOp_t (sum, prod, max, min; no avg);
    # bfloat16 is left out until checked on an MLU (a cast is always correct, only slower).
    # Not exercised on hardware here.
    reduce_dtypes=_ops({op: _CNCL_ARITH for op in ("sum", "max", "min", "product")}),
    copy_dtypes=frozenset({F16, F32, I8, I16, I32, U8, BOOL}),
    contiguous=True,
    source="Cambricon CNCL developer guide (not verified on hardware)",
)

RKNPU = Constraints(
    name="rknpu",
    # RK3588 has no collective library: the vendor row sets stage_through_cpu and the gloo rules apply
    # to host copies of every tensor.
    reduce_dtypes=GLOO.reduce_dtypes,
    copy_dtypes=GLOO.copy_dtypes,
    contiguous=True,
    device_tensors=False,
    source="npudist vendor table (rknpu: stage_through_cpu) + gloo row",
)

PROFILES: Mapping[str, Constraints] = MappingProxyType(
    {c.name: c for c in (GLOO, NCCL, HCCL, HCCL_STRICT, CNCL, RKNPU)}
)

def profile(name: str) -> Constraints:
    """The named profile, or ValueError listing the names that exist."""
    try:
        return PROFILES[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown collective profile {name!r} (from {PROFILE_VAR} or set_profile); "
            f"choose one of {', '.join(PROFILES)}"
        ) from None


def for_backend(backend: str, stage_through_cpu: bool = False) -> Constraints:
    """The row of a running backend; unknown backends get gloo's permissive row under their own name."""
    if stage_through_cpu:
        return RKNPU
    row = PROFILES.get(backend.lower())
    if row is None:
        from dataclasses import replace

        return replace(GLOO, name=backend, source=f"unknown backend {backend!r}: no constraints applied")
    return row


def select(name: str | None, group: object | None = None) -> Constraints:
    """The profile ``name`` when given, else the row of the backend running ``group`` (or, before a
    process group exists, of the detected accelerator's backend)."""
    if name:
        return profile(name)
    acc = accelerator()
    if dist.is_available() and dist.is_initialized():
        return for_backend(str(dist.get_backend(group)), acc.stage_through_cpu)
    return for_backend(acc.backend, acc.stage_through_cpu)


def _dtype_names(dtypes: frozenset[torch.dtype]) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes)) or "none"


def describe(c: Constraints) -> str:
    """One line per field, for `npudist doctor`."""
    lines = []
    for f in fields(c):
        value = getattr(c, f.name)
        if f.name == "reduce_dtypes":
            for op in REDUCE_OPS:
                native = value.get(op)
                shown = _dtype_names(native) if native else (
                    "emulated as sum then divide" if op == "avg" else "not supported")
                lines.append(f"reduce {op}: {shown}")
            continue
        if f.name == "copy_dtypes":
            value = _dtype_names(value)
        lines.append(f"{f.name}: {value}")
    return "\n".join(lines)
