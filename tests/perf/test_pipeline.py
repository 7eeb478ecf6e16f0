"""Chunked (pipelined) adapted all_reduce and the recording switch.

Expected values are worked out by hand from the inputs in rank_pipeline.py, never copied from a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from npudist.comm.constraints import HCCL_STRICT
from npudist.comm.pipeline import chunk_bounds, chunk_unit, eligible
from npudist.comm.plan import TensorFacts, plan_reduce
from npudist.comm.recorder import Recorder
from tests.conftest import run_npudist

HERE = Path(__file__).parent


def test_chunk_bounds_cover_everything_once_on_unit_boundaries():
    assert chunk_bounds(1024, 4, 128) == [(0, 256), (256, 512), (512, 768), (768, 1024)]
    # 1000 / 3 = 334 -> rounded up to 384 (3 x 128)
    assert chunk_bounds(1000, 3, 128) == [(0, 384), (384, 768), (768, 1000)]
    assert chunk_bounds(5, 8, 1) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert chunk_bounds(0, 4, 128) == []


def test_chunk_bounds_rejects_nonsense_with_the_values():
    with pytest.raises(ValueError, match="chunks=0"):
        chunk_bounds(10, 0, 1)


def test_chunk_unit_keeps_element_multiple_and_byte_alignment():
    assert chunk_unit(128, 128, 4) == 128  # hccl-strict fp32: 128 elements = 512 B, 128-B aligned
    assert chunk_unit(1, 128, 4) == 32  # 32 fp32 = 128 B
    assert chunk_unit(1, 1, 4) == 1
    assert chunk_unit(3, 8, 4) == 6  # lcm(3, 2)


def test_only_large_synchronous_contiguous_copies_are_chunked():
    big = torch.zeros(4 * 2**20, dtype=torch.bfloat16)  # 8 MiB
    plan = plan_reduce(HCCL_STRICT, "sum", TensorFacts(big.dtype, big.numel(), True, big.data_ptr(), "cpu"))
    assert eligible(plan, big, big.numel() * 2, async_op=False)
    assert not eligible(plan, big, big.numel() * 2, async_op=True)
    small = torch.zeros(10, dtype=torch.bfloat16)
    assert not eligible(plan, small, 20, async_op=False)
    strided = big.view(2, -1).t()
    assert not eligible(plan, strided, big.numel() * 2, async_op=False)


def test_disabled_recorder_counts_nothing_and_count_follows_buckets():
    rec = Recorder()
    rec.enabled = False
    rec.record("all_reduce", "gloo", 100, 0.001)
    rec.inflight("all_reduce", "gloo", 1)
    assert rec.snapshot().ops == ()
    rec.enabled = True
    rec.record("all_reduce", "gloo", 100, 0.001)
    s = rec.snapshot().get("all_reduce")
    assert (s.calls, s.duration_count, s.duration_buckets[-1][1]) == (1, 1, 1)


@pytest.mark.ranks
@pytest.mark.slow
def test_chunked_strict_all_reduce_and_recording_switch_on_two_ranks():
    proc = run_npudist(["launch", "--nproc-per-node", "2", str(HERE / "rank_pipeline.py")], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    # sum over ranks 0,1 of (r+1)*(i%7)+0.5 = 3*(i%7) + 1
    assert got["sum_head"] == [1.0, 4.0, 7.0, 10.0, 13.0, 16.0, 19.0, 1.0]
    # i = 997, 998, 999: i % 7 = 3, 4, 5
    assert got["sum_tail"] == [10.0, 13.0, 16.0]
    assert got["kinds"] == {"cast": 1, "pad": 1}
    assert got["avg_distinct"] == [2.0]  # (1 + 3) / 2
    assert got["max_distinct"] == [-1.0]  # max(-1, -2); the -inf padding never wins
    assert got["calls"] == [3, 3, 4]
    assert got["count_matches_buckets"] is True
