"""Planning rules, profiles, accounting and buffers: pure functions, no process group."""

from __future__ import annotations

import pytest
import torch

from npudist.comm import PROFILES, describe, profile
from npudist.comm.buffers import BufferPool, aligned_empty
from npudist.comm.plan import TensorFacts, neutral, plan_copy, plan_reduce
from npudist.comm.recorder import DURATION_BUCKETS, Recorder

STRICT = PROFILES["hccl-strict"]
GLOO = PROFILES["gloo"]
HCCL = PROFILES["hccl"]
ALIGNED = 1024  # a data pointer that satisfies every alignment rule


def test_bf16_under_strict_is_cast_to_float32_and_nothing_else():
    p = plan_reduce(STRICT, "sum", TensorFacts(torch.bfloat16, 256, True, ALIGNED, "cpu"))
    assert p.work_dtype == torch.float32
    assert p.kinds == ("cast",)
    assert (p.chunk, p.padded_chunk) == (256, 256)


def test_odd_count_strided_under_strict_is_padded_to_128_and_made_contiguous():
    p = plan_reduce(STRICT, "max", TensorFacts(torch.float32, 130, False, ALIGNED, "cpu"))
    assert p.padded_chunk == 256
    assert p.kinds == ("contiguous", "pad")


def test_misaligned_pointer_alone_costs_an_align_copy():
    p = plan_reduce(STRICT, "sum", TensorFacts(torch.float32, 128, True, ALIGNED + 4, "cpu"))
    assert p.kinds == ("align",) and p.copy


def test_reduce_scatter_pads_each_chunk():
    # 2 ranks x 3 elements: each rank's chunk becomes 128 elements.
    p = plan_reduce(STRICT, "sum", TensorFacts(torch.float16, 6, True, ALIGNED, "cpu"), chunks=2)
    assert (p.chunk, p.padded_chunk) == (3, 128)


def test_gloo_has_no_int16_so_it_widens_to_int32():
    # ProcessGroupGloo answers "Invalid scalar type" for int16 (checked on torch 2.13).
    assert plan_reduce(GLOO, "sum", TensorFacts(torch.int16, 10, True, ALIGNED, "cpu")).work_dtype == torch.int32


def test_hccl_product_on_bf16_widens_to_float32_but_sum_stays_bf16():
    # CANN HcclAllReduce on Atlas A2/A3: bf16 supported except for prod.
    product = plan_reduce(HCCL, "product", TensorFacts(torch.bfloat16, 8, True, ALIGNED, "npu"))
    assert product.work_dtype == torch.float32
    assert plan_reduce(HCCL, "sum", TensorFacts(torch.bfloat16, 8, True, ALIGNED, "npu")).kinds == ()


def test_avg_without_native_avg_is_sum_then_divide():
    p = plan_reduce(HCCL, "avg", TensorFacts(torch.float32, 8, True, ALIGNED, "npu"))
    assert (p.native_op, p.divide, p.kinds) == ("sum", True, ())


def test_bitwise_on_float_names_backend_op_dtype_and_supported_set():
    with pytest.raises(TypeError) as err:
        plan_reduce(GLOO, "band", TensorFacts(torch.float32, 8, True, ALIGNED, "cpu"), backend="gloo")
    msg = str(err.value)
    for part in ("'band'", "torch.float32", "backend gloo", "{bool, int32, int64, int8, uint8}"):
        assert part in msg


def test_int_under_strict_is_refused_with_the_float_only_set():
    with pytest.raises(TypeError, match=r"torch.int32 .*\{float16, float32\}"):
        plan_reduce(STRICT, "sum", TensorFacts(torch.int32, 8, True, ALIGNED, "cpu"))


def test_avg_of_integers_is_refused():
    with pytest.raises(TypeError, match="avg needs a floating-point tensor"):
        plan_reduce(HCCL, "avg", TensorFacts(torch.int32, 8, True, ALIGNED, "npu"))


def test_movement_reinterprets_bytes_same_width_first():
    p = plan_copy(STRICT, TensorFacts(torch.bfloat16, 128, True, ALIGNED, "cpu"))
    assert (p.work_dtype, p.reinterpret, p.padded_chunk, p.kinds) == (torch.float16, True, 128, ("cast",))
    # 3 int64 = 24 bytes = 12 float16 words, padded to 128.
    p = plan_copy(STRICT, TensorFacts(torch.int64, 3, True, ALIGNED, "cpu"))
    assert (p.work_dtype, p.padded_chunk, p.kinds) == (torch.float16, 128, ("cast", "pad"))


def test_device_tensors_are_staged_where_the_row_says_so():
    p = plan_reduce(PROFILES["rknpu"], "sum", TensorFacts(torch.float32, 4, True, ALIGNED, "cuda"))
    assert p.stage and p.kinds == ("stage",)
    assert plan_reduce(PROFILES["rknpu"], "sum", TensorFacts(torch.float32, 4, True, ALIGNED, "cpu")).kinds == ()


@pytest.mark.parametrize(("op", "dtype", "value"), [
    ("sum", torch.float32, 0), ("product", torch.int32, 1), ("max", torch.float16, float("-inf")),
    ("min", torch.float32, float("inf")), ("max", torch.uint8, 0), ("min", torch.int8, 127),
    ("band", torch.int64, -1), ("band", torch.uint8, 255), ("min", torch.bool, True),
])
def test_padding_is_the_ops_neutral_value(op, dtype, value):
    assert neutral(op, dtype) == value


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ValueError, match="hccl-strict"):
        profile("hccl-strictest")


def test_describe_prints_one_line_per_field():
    text = describe(STRICT).splitlines()
    assert "element_multiple: 128" in text
    assert "alignment_bytes: 128" in text
    assert "reduce sum: float16, float32" in text
    assert "reduce avg: emulated as sum then divide" in text


def test_recorder_cumulative_buckets_and_reset_keeps_inflight():
    rec = Recorder()
    rec.record("all_reduce", "gloo", 100, 0.0002, ("cast",))
    rec.record("all_reduce", "gloo", 50, 0.02, ())
    rec.inflight("all_reduce", "gloo", 1)
    s = rec.snapshot().get("all_reduce", "gloo")
    assert (s.calls, s.bytes, s.duration_count, s.inflight) == (2, 150, 2, 1)
    assert s.duration_sum_seconds == pytest.approx(0.0202)
    b = dict(s.duration_buckets)
    assert (b[1e-4], b[5e-4], b[0.01], b[0.05], b[float("inf")]) == (0, 1, 1, 2, 2)
    assert [bound for bound, _ in s.duration_buckets] == list(DURATION_BUCKETS)
    assert s.adaptations == {"cast": 1, "contiguous": 0, "pad": 0, "align": 0, "stage": 0}
    rec.reset()
    s = rec.snapshot().get("all_reduce", "gloo")
    assert (s.calls, s.inflight) == (0, 1)


def test_pool_reuses_released_blocks_and_aligns():
    pool = BufferPool()
    a = pool.acquire(1000, torch.float32, torch.device("cpu"), 128)
    assert a.tensor.data_ptr() % 128 == 0 and a.tensor.numel() == 1000
    pool.release(a)
    b = pool.acquire(600, torch.float32, torch.device("cpu"), 128)
    assert b.whole.data_ptr() == a.whole.data_ptr() and b.tensor.numel() == 600
    c = pool.acquire(600, torch.float32, torch.device("cpu"), 128)  # b is still lent out
    assert c.whole.data_ptr() != b.whole.data_ptr()
    assert pool.allocations == 2
    assert aligned_empty(3, torch.float64, torch.device("cpu"), 256).data_ptr() % 256 == 0


def test_hccl_row_names_only_types_and_ops_the_released_hccl_header_declares():
    """Each dtype and reduce op of the hccl row exists in hccl_types.h of the torch-npu 2.14.0 wheel."""
    from tests.conftest import FAKES

    declared = {tuple(line.split()) for line in (FAKES / "hccl" / "enums-torch_npu-2.14.0.txt").read_text()
                .splitlines() if line and not line.startswith("#")}
    # torch dtype -> HcclDataType member (bool travels as uint8: torch_npu ProcessGroupHCCL).
    hccl_type = {torch.int8: "INT8", torch.int16: "INT16", torch.int32: "INT32", torch.int64: "INT64",
                 torch.uint8: "UINT8", torch.bool: "UINT8", torch.float16: "FP16", torch.float32: "FP32",
                 torch.float64: "FP64", torch.bfloat16: "BFP16"}
    hccl_op = {"sum": "SUM", "product": "PROD", "max": "MAX", "min": "MIN"}
    row = PROFILES["hccl"]
    dtypes = set(row.copy_dtypes).union(*row.reduce_dtypes.values())
    assert torch.bfloat16 in dtypes
    for dtype in dtypes:
        assert ("HcclDataType", f"HCCL_DATA_TYPE_{hccl_type[dtype]}") in declared, dtype
    for op in row.reduce_dtypes:
        assert ("HcclReduceOp", f"HCCL_REDUCE_{hccl_op[op]}") in declared, op
