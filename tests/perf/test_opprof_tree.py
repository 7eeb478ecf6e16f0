"""Operator timing read from the profiler's C++ event tree (the cheap path) instead of FunctionEvents."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from npudist.telemetry.job import op_sampling


@dataclass
class Node:
    name: str
    duration_time_ns: int
    children: list = field(default_factory=list)


def test_self_time_is_own_duration_minus_children():
    # aten::linear (untracked) 10 us -> aten::addmm 8 us -> aten::copy_ 3 us: addmm self = 5 us
    tree = [Node("aten::linear", 10_000, [Node("aten::addmm", 8_000, [Node("aten::copy_", 3_000)])]),
            Node("aten::_softmax", 2_000)]
    got = sorted(op_sampling.tree_op_durations(tree))
    assert got == [("matmul", pytest.approx(5e-6)), ("softmax", pytest.approx(2e-6))]


def test_untracked_ops_are_dropped_and_children_never_exceed_parent():
    assert op_sampling.tree_op_durations([Node("aten::add", 5_000)]) == []
    # clock skew between nodes must not produce a negative observation
    assert op_sampling.tree_op_durations([Node("aten::mm", 1_000, [Node("x", 1_500)])]) == [("matmul", 0.0)]


def test_tree_path_counts_the_same_calls_as_function_events_on_a_real_profile():
    x = torch.randn(32, 32)
    prof = op_sampling.start_profiler("cpu")
    torch.nn.functional.layer_norm((x @ x).softmax(-1), (32,))
    prof.__exit__(None, None, None)
    fast = op_sampling.profiled_op_durations(prof, "cpu")
    slow = op_sampling.op_durations(prof.events())
    assert sorted(op for op, _ in fast) == sorted(op for op, _ in slow) == ["layer_norm", "matmul", "softmax"]
    for (op_a, s_a), (op_b, s_b) in zip(sorted(fast), sorted(slow), strict=True):
        assert op_a == op_b
        assert s_a == pytest.approx(s_b, abs=2e-6)  # FunctionEvents round to whole microseconds
