"""One rank of DTensor and raw-collective calls on the simulated NPU, as torch's tests make them: OUT_DIR/rank{R}.json.

The calls follow torch's DTensor tests (test/distributed/tensor/test_redistribute.py: Shard -> Replicate,
Shard(0) -> Shard(1), Partial -> Replicate; test_random_ops.py: a random op on a sharded and on a replicated
DTensor) and test/distributed/test_c10d_common.py's object collectives; the process group is made the way an
Ascend port makes it: ``backend="hccl", device_id=torch.device("npu", local_rank)``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor


def refusal(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # what the call raised, by name and text
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> None:
    out_dir = Path(sys.argv[1])
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("npu", local)
    torch.npu.set_device(local)
    dist.init_process_group(backend="hccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    r: dict = {"backend_for_npu": dist.group.WORLD._get_backend(dev).name(),
               "backend_for_cpu": refusal(lambda: dist.group.WORLD._get_backend(torch.device("cpu")))}
    from npudist.sim import guard

    # every npu:i a chip of its own (where the simulation's C++ device guard is built)
    r["separate_chips"] = [guard.available(), guard.reason()]
    r["device_count"] = torch.npu.device_count()
    r["current_device"] = [torch.npu.current_device(), str(torch.ones(1, device="npu").device)]
    other = torch.device("npu", (local + 1) % torch.npu.device_count())
    r["mixed_op"] = refusal(lambda: torch.ones(2, device=dev) + torch.ones(2, device=other))
    # HCCL's own fault case: a reduce_scatter whose output is on this rank's chip and inputs on the next one
    r["cross_device_reduce_scatter"] = refusal(lambda: dist.reduce_scatter(
        torch.empty(2, device=dev), [torch.ones(2, device=other) for _ in range(world)]))
    moved = torch.ones(2, device=dev).to(other)
    r["copy_between_chips"] = [str(moved.device), moved.to("cpu").tolist()]
    mesh = init_device_mesh("npu", (world,), mesh_dim_names=("dp",))
    r["mesh"] = [mesh.device_type, list(mesh.mesh_dim_names), dist.get_process_group_ranks(mesh["dp"].get_group())]

    full = torch.arange(4 * world * 6, dtype=torch.float32).reshape(4 * world, 6)
    dt = distribute_tensor(full.to(dev), mesh, [Shard(0)])
    r["local_rows"] = dt.to_local().to("cpu")[:, 0].tolist()
    r["shard_to_replicate"] = torch.equal(dt.redistribute(mesh, [Replicate()]).to_local().to("cpu"), full)
    s1 = dt.redistribute(mesh, [Shard(1)])
    r["shard0_to_shard1"] = torch.equal(s1.to_local().to("cpu"), full.chunk(world, dim=1)[rank])
    partial = torch.distributed.tensor.DTensor.from_local(torch.full((3,), float(rank + 1), device=dev), mesh,
                                                          [Partial()])
    r["partial_to_replicate"] = partial.redistribute(mesh, [Replicate()]).to_local().to("cpu").tolist()

    # flat collectives under every name torch has for them (FSDP2 on torch 2.13 calls the *_single ones)
    x = torch.full((4,), float(rank + 1), device=dev)
    flat: dict = {}
    for name in ("all_gather_into_tensor", "all_gather_single"):
        if hasattr(dist, name):
            out = torch.empty(4 * world, device=dev)
            getattr(dist, name)(out, x)
            flat[name] = out.to("cpu").tolist()
    for name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        if hasattr(dist, name):
            out = torch.empty(2, device=dev)
            getattr(dist, name)(out, torch.arange(2.0 * world, device=dev) * (rank + 1))
            flat[name] = out.to("cpu").tolist()
    r["flat"] = flat
    r["flat_cpu"] = refusal(lambda: dist.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4)))
    r["flat_strided"] = refusal(lambda: dist.all_gather_into_tensor(torch.empty(2 * world, device=dev),
                                                                    torch.ones(4, device=dev)[::2]))
    # object collectives with objects of different sizes on each rank
    objects: list = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "pad": "x" * (10 + 1000 * rank)})
    r["objects"] = [(o["rank"], len(o["pad"])) for o in objects]
    listed = [{"from": 0, "blob": list(range(50))}] if rank == 0 else [None]
    dist.broadcast_object_list(listed, src=0)
    r["broadcast_object"] = len(listed[0]["blob"])

    # random ops: torch_npu's generator state is (seed, offset); DTensor's tracker moves the offset
    torch.manual_seed(5)
    state = torch.npu.get_rng_state()
    r["rng_state"] = [str(state.dtype), state.numel(), state.view(torch.int64).tolist()]
    sharded = torch.distributed.tensor.randn((4 * world, 4), device_mesh=mesh, placements=[Shard(0)])
    r["rng_offset_after_sharded"] = torch.npu.get_rng_state().view(torch.int64).tolist()[1]
    replicated = torch.distributed.tensor.randn((4, 4), device_mesh=mesh, placements=[Replicate()])
    r["sharded_local"] = sharded.to_local().to("cpu").flatten().tolist()
    r["replicated_local"] = replicated.to_local().to("cpu").flatten().tolist()
    torch.npu.set_rng_state(state)
    again = torch.distributed.tensor.randn((4 * world, 4), device_mesh=mesh, placements=[Shard(0)])
    r["rng_restored"] = torch.equal(again.to_local().to("cpu"), sharded.to_local().to("cpu"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(r))
    dist.destroy_process_group()
    os._exit(0)  # as parallel_job.py: gloo groups still held by the mesh must not be joined at finalization


if __name__ == "__main__":
    main()
