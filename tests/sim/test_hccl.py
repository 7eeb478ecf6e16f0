"""The simulated hccl refuses what HCCL refuses, and npudist's own messages still get through it."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from npudist.comm.constraints import HCCL
from npudist.runtime import compat
from npudist.sim.hccl import SimHcclGroup
from tests.conftest import run_npudist

# Each job starts real ranks whose every op goes through Python dispatch: minutes on a loaded CI host.
pytestmark = [pytest.mark.slow, pytest.mark.ranks, pytest.mark.timeout(1200),
              pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")]

SCRIPT = "tests/sim/rank_hccl.py"


def _ranks(tmp: Path, mode: str, nproc: int) -> dict[int, dict]:
    out, run_dir = tmp / "out", tmp / "run"
    out.mkdir()
    proc = run_npudist(["launch", "--simulate", mode, "--nproc-per-node", str(nproc), SCRIPT, str(out),
                        str(run_dir)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)}


@pytest.fixture(scope="module")
def default(tmp_path_factory) -> dict[int, dict]:
    return _ranks(tmp_path_factory.mktemp("hccl"), "npu", 2)


@pytest.fixture(scope="module")
def strict(tmp_path_factory) -> dict[int, dict]:
    return _ranks(tmp_path_factory.mktemp("strict"), "npu:strict", 3)


def test_each_rank_sees_one_chip_its_local_rank(default, strict):
    for ranks in (default, strict):
        for rank, r in ranks.items():
            # A rank of a real host sees every chip of its node and takes npu:<local rank>.
            assert (r["device"], r["backend"], r["accelerator"]) == (f"npu:{rank}", "hccl", "npu-sim")
            assert r["chip"] == rank  # one node: chip = local rank


def test_a_device_mesh_finds_the_groups_name(default, strict):
    for r in [*default.values(), *strict.values()]:
        mesh_group, world_group = r["mesh_group"]
        assert mesh_group and mesh_group == world_group  # a 1-D mesh over every rank is the default group


def test_a_wait_on_a_view_of_a_functional_collective_releases_its_work(default):
    # registered by the all-gather, released by the wait on a view of its output (funcol.py): measured [1, 1]
    # before, which left torchtitan 28 all-gather outputs (17.5 MB) a step in the registry
    for r in default.values():
        assert r["funcol_view_wait"] == [1, 0]


def test_a_cpu_tensor_is_refused_with_the_real_message(default):
    for r in default.values():
        assert r["cpu_tensor"] == "RuntimeError: No backend type associated with device type cpu"
        assert r["raw_sum_ok"]
        assert r["raw_strided"] == "RuntimeError: Tensors must be contiguous"


def test_default_row_takes_bf16_and_any_length(default):
    for r in default.values():
        assert r["row"] == "hccl"
        assert r["raw_bf16"] is None and r["raw_100"] is None and r["raw_misaligned"] is None


def test_avg_is_sum_then_divide_on_the_default_row_and_refused_on_the_strict_one(default, strict):
    """torch_npu's ProcessGroupHCCL reduces AVG as SUM and divides by the group size (getHcclReduceOp); releases
    before Ascend/pytorch !17393 (2025-02), which the strict row stands for, refused it."""
    for r in default.values():
        assert r["raw_bf16_avg"] is None and r["raw_bf16_avg_values"] == [1.5]  # (1 + 2) / 2, in bf16
        assert r["raw_f32_avg"] is None and r["raw_f32_avg_values"] == [1.5]
        # the division of an integer sum is torch's own refusal, as on torch_npu (before Ascend950)
        assert "can't be cast to the desired output type Long" in r["raw_int_avg"]
    for r in strict.values():
        assert "HCCL_E_NOT_SUPPORT" in r["raw_bf16_avg"] and r["raw_bf16_avg_values"] == [float(r["chip"] + 1)]
        assert "reduce op avg on torch.float32 is not supported (hccl-strict row)" in r["raw_f32_avg"]
        assert r["raw_f32_avg_values"] == [float(r["chip"] + 1)]  # refused before anything moved


def test_bool_and_uint8_all_reduce_go_through_torch_npus_int32_cast(default, strict):
    """ProcessGroupHCCL casts kBool/kByte to kInt before HcclAllReduce and copies back; reduce-scatter has no
    such cast, so there HCCL's own refusal stays."""
    for ranks in (default, strict):
        world = len(ranks)
        for r in ranks.values():
            assert r["raw_bool_sum"] is None and r["raw_bool_values"] == [True, False, True]
            assert r["raw_uint8_sum"] is None and r["raw_uint8_values"] == [(200 * world) % 256] * 4
            assert "HCCL_E_NOT_SUPPORT" in r["raw_bool_reduce_scatter"]


def test_strict_row_refuses_with_hccl_error_names(strict):
    for r in strict.values():
        assert r["row"] == "hccl-strict"
        assert r["raw_bf16"].startswith("HcclError: HcclAllReduce failed: HCCL_E_NOT_SUPPORT (error code 5)")
        assert r["raw_100"].startswith("HcclError: HcclAllReduce failed: HCCL_E_PARA (error code 1): count 100")
        assert "128-byte aligned" in r["raw_misaligned"]
        assert r["refused"]["HcclAllReduce"] >= 3


def test_npudist_adapts_where_raw_calls_are_refused(default, strict):
    for r in (*default.values(), *strict.values()):
        assert r["npudist_bf16_ok"]


def test_checkpoints_and_the_lock_use_device_tensors_on_hccl(default, strict):
    # The synchronous save agrees on success over the group: a CPU flag would have been refused above.
    for ranks in (default, strict):
        for r in ranks.values():
            assert r["checkpoint_step"] == 4 and r["checkpoint_values"] == [0, 1, 2, 3, 4, 5]
            assert r["refused"].get("HcclBroadcast", 0) == 0


def test_the_backend_counts_what_it_did(default):
    r = default[0]
    assert r["calls"]["all_reduce"] >= 3  # raw sum, npudist's bf16, checkpoint flags
    assert r["bytes"]["all_reduce"] >= 128 * 4


def _native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_destroying_the_group_joins_its_host_threads_before_interpreter_exit():
    # A gloo group left to interpreter finalization can abort the rank at exit; destroy_process_group
    # calls shutdown(), which must end the host group's worker threads there and then.
    before = _native_threads()
    group = SimHcclGroup(dist.HashStore(), 0, 1, timedelta(seconds=30), HCCL)
    assert _native_threads() > before  # gloo's worker threads
    group.shutdown()
    assert _native_threads() <= before
    with pytest.raises(RuntimeError, match="was shut down"):
        group.barrier()
