"""FSDP2, HSDP, tensor parallel and DTensor on the simulated NPU, checked against the same job on CPU/gloo.

The jobs (parallel_job.py, dtensor_job.py) are written after the public scripts they cite; the CPU job is the
reference: gloo carries both, so the reduction order is the same and the losses and final weights must be equal
bit for bit. Every op of a simulated tensor goes through Python dispatch, so the models are small.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from npudist.runtime import compat
from tests.conftest import run_npudist, run_ranks
from tests.sim import chips

pytestmark = [pytest.mark.slow, pytest.mark.ranks, pytest.mark.timeout(900),
              pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")]

STAND_IN = Path(__file__).resolve().parents[2] / "src" / "npudist" / "sim" / "stand_in"
SIMULATE = {"NPUDIST_SIMULATE": "npu"}


def _job(tmp: Path, script: str, args: list[str], world: int, env: dict[str, str]) -> dict[int, dict]:
    out = tmp / "out"
    run_ranks(f"tests/sim/{script}", [*args[:1], str(out), *args[1:]], world=world, env=env,
              pythonpath=[STAND_IN], timeout=600)
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(world)}


@pytest.fixture(scope="module")
def cpu_fsdp2(tmp_path_factory) -> dict[int, dict]:
    return _job(tmp_path_factory.mktemp("cpu_fsdp2"), "parallel_job.py", ["fsdp2", "--device", "cpu"], 2, {})


def test_fsdp2_example_trains_on_two_simulated_npus_with_the_cpu_losses(cpu_fsdp2, tmp_path):
    """pytorch/examples distributed/FSDP2/example.py's loop, device and backend picked as the example picks them
    (torch.accelerator, get_default_backend_for_device, device_id)."""
    sim = _job(tmp_path, "parallel_job.py", ["fsdp2", "--device", "npu"], 2, SIMULATE)
    cpu = cpu_fsdp2[0]
    assert cpu["losses"][-1] < cpu["losses"][0]  # it trains
    for rank, r in sim.items():
        assert r["device"] == f"npu:{rank}" and r["placements"] == ["(Shard(dim=0),)"]
        assert r["losses"] == cpu["losses"]
        assert r["params_sha256"] == cpu["params_sha256"]


def test_hsdp_on_a_two_by_two_mesh_matches_the_cpu_job(cpu_fsdp2, tmp_path):
    """HSDP as torch's FSDP2 tests build it (fully_shard(mesh=2-D mesh)). Every rank trains on the same batch, so
    each replica's gradient is the one FSDP's two shards hold and the average over 4 equals the average over 2
    exactly: the 2-rank CPU job is the reference."""
    sim = _job(tmp_path, "parallel_job.py", ["hsdp", "--device", "npu"], 4, SIMULATE)
    shard_groups = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    replicate_groups = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    for rank, r in sim.items():
        assert r["mesh"] == {"names": ["replicate", "shard"], "shard_group": shard_groups[rank],
                             "replicate_group": replicate_groups[rank]}
        assert r["placements"] == ["(Replicate(), Shard(dim=0))"]
        assert r["losses"] == cpu_fsdp2[0]["losses"]
        assert r["params_sha256"] == cpu_fsdp2[0]["params_sha256"]


def test_tensor_parallel_colwise_rowwise_matches_the_cpu_job(tmp_path):
    """pytorch/examples distributed/tensor_parallelism/tensor_parallel_example.py: ColwiseParallel in_proj,
    RowwiseParallel out_proj."""
    cpu = _job(tmp_path / "cpu", "parallel_job.py", ["tp", "--device", "cpu"], 2, {})
    sim = _job(tmp_path / "npu", "parallel_job.py", ["tp", "--device", "npu"], 2, SIMULATE)
    assert cpu[0]["losses"][-1] < cpu[0]["losses"][0]
    for r in sim.values():
        assert r["placements"] == ["(Replicate(),)", "(Shard(dim=0),)", "(Shard(dim=1),)"]
        assert (r["losses"], r["params_sha256"]) == (cpu[0]["losses"], cpu[0]["params_sha256"])


@pytest.fixture(scope="module")
def dtensor(tmp_path_factory) -> dict[int, dict]:
    return _job(tmp_path_factory.mktemp("dtensor"), "dtensor_job.py", [], 2, SIMULATE)


def test_a_group_bound_to_an_npu_has_an_hccl_backend_for_it_only(dtensor):
    for r in dtensor.values():
        assert r["backend_for_npu"] == "hccl"
        assert r["backend_for_cpu"] == "RuntimeError: No backend type associated with device type cpu"
        assert r["mesh"] == ["npu", ["dp"], [0, 1]]


def test_dtensor_redistributes(dtensor):
    for rank, r in dtensor.items():
        assert r["local_rows"] == [float(6 * row) for row in range(4 * rank, 4 * rank + 4)]
        assert r["shard_to_replicate"] and r["shard0_to_shard1"]
        assert r["partial_to_replicate"] == [3.0, 3.0, 3.0]  # 1 + 2


def test_flat_collectives_under_both_names_and_their_refusals(dtensor):
    for rank, r in dtensor.items():
        gathered = [1.0] * 4 + [2.0] * 4
        # reduce-scatter of arange(4) * (rank + 1) summed over ranks 1 and 2: arange(4) * 3, split in two
        scattered = [[0.0, 3.0], [6.0, 9.0]][rank]
        for name, got in r["flat"].items():
            assert got == (gathered if "gather" in name else scattered), name
        assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= set(r["flat"])
        assert r["flat_cpu"] == "RuntimeError: No backend type associated with device type cpu"
        assert r["flat_strided"] == "RuntimeError: Tensors must be contiguous"


def test_object_collectives_take_objects_of_different_sizes(dtensor):
    for r in dtensor.values():
        assert r["objects"] == [[0, 10], [1, 1010]]
        assert r["broadcast_object"] == 50


def test_dtensor_random_ops_use_torch_npus_seed_and_offset_state(dtensor):
    """DTensor's RNG tracker reads the generator state as (seed, offset) (torch/distributed/tensor/_random.py,
    _PhiloxState): ranks holding different shards draw different numbers, ranks holding the same (replicated)
    tensor draw the same, and every rank moves past the whole tensor (32 elements)."""
    r0, r1 = dtensor[0], dtensor[1]
    assert r0["rng_state"] == ["torch.uint8", 16, [5, 0]]
    assert r0["rng_offset_after_sharded"] == r1["rng_offset_after_sharded"] == 32
    assert r0["sharded_local"] != r1["sharded_local"]
    assert r0["replicated_local"] == r1["replicated_local"]
    assert r0["rng_restored"] and r1["rng_restored"]


def _separate_chips(r: dict) -> None:
    available, reason = r["separate_chips"]
    if not available:  # the one-device fallback (sim/guard.py): what it keeps is in docs/guide/simulated-npu.md
        pytest.skip(f"the simulated NPU's C++ device guard is not built here: {reason}")


def test_every_npu_index_is_a_chip_of_its_own(dtensor):
    for rank, r in dtensor.items():
        assert r["device_count"] == 8  # no ASCEND_RT_VISIBLE_DEVICES: every chip of an 8-chip host
        _separate_chips(r)
        assert r["current_device"] == [rank, f"npu:{rank}"]  # set_device(local_rank), then "npu" means it
        assert r["mixed_op"].startswith("RuntimeError: Expected all tensors to be on the same device, but found at "
                                        f"least two devices, npu:{rank} and npu:{rank + 1}!")
        assert r["copy_between_chips"] == [f"npu:{rank + 1}", [1.0, 1.0]]


def test_hccls_cross_device_fault_case_fails_with_hccls_text(dtensor):
    """A reduce_scatter with its output on npu:r and its inputs on npu:r+1 (torch_npu ProcessGroupHCCL.cpp,
    flatten_for_scatter_gather)."""
    for r in dtensor.values():
        _separate_chips(r)
        assert r["cross_device_reduce_scatter"] == ("RuntimeError: Corresponding input/output tensors to "
                                                    "scatter/gather must all reside on the same device")


def test_fsdp2_ported_the_ascend_way_trains_with_the_cpu_losses(cpu_fsdp2, tmp_path):
    """The same example as torch_npu's guides port it: import torch_npu, torch.npu.set_device(local_rank),
    backend="hccl", device_id=torch.device("npu", local_rank). FSDP2 then checks that each parameter is on
    npu:<local_rank>, which needs each index to be a device of its own."""
    if not chips.separate():
        pytest.skip("the simulated NPU's C++ device guard is not built here: every tensor is on npu:0")
    sim = _job(tmp_path, "parallel_job.py", ["fsdp2", "--device", "npu", "--ascend"], 2, SIMULATE)
    for rank, r in sim.items():
        assert r["device"] == f"npu:{rank}" and r["loss_device"] == f"npu:{rank}"
        assert (r["losses"], r["params_sha256"]) == (cpu_fsdp2[0]["losses"], cpu_fsdp2[0]["params_sha256"])


@pytest.mark.e2e
def test_the_fsdp2_example_as_published_runs_on_two_simulated_npus(tmp_path):
    """pytorch/examples distributed/FSDP2/example.py (tests/migrate/corpus/pytorch_fsdp2), unchanged, under
    ``npudist launch --simulate npu``: no torch_npu import, the device found through torch.accelerator, 10
    steps, the example's own checkpoint. Its losses are not compared: the example's Transformer.reset_parameters
    skips the blocks, so their weights are whatever to_empty's memory held (on the simulated device, reused host
    memory), on any device; parallel_job.py is the same loop from defined weights."""
    example = Path(__file__).resolve().parents[1] / "migrate" / "corpus" / "pytorch_fsdp2" / "example.py"
    proc = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "2", str(example)], cwd=tmp_path,
                       timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Running on rank 0 on device npu:0" in proc.stdout
    assert "Running on rank 1 on device npu:1" in proc.stdout
    (saved,) = (tmp_path / "checkpoints" / "dtensor_api").iterdir()
    model = torch.load(saved / "model_state_dict.pt", weights_only=True)
    optim = torch.load(saved / "optim_state_dict.pt", weights_only=True)
    assert model["tok_embeddings.weight"].shape == (1024, 16)  # gathered whole from the two shards
    assert {float(s["step"]) for s in optim["state"].values()} == {10.0}  # ten optimizer steps on every param
