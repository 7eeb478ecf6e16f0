"""Runs inside each rank for test_hccl.py under ``npudist launch --simulate MODE``: OUT_DIR/rank{R}.json.

Raw ``torch.distributed`` calls meet the simulated HCCL's refusals; npudist's own calls (collectives,
checkpoint flags, the run-dir lock) must get through them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import npudist
from npudist import checkpoint
from npudist.comm.buffers import aligned_empty
from npudist.sim.state import SIM


def refusal(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # what the raw call raised, by name and text
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> None:
    out_dir, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    ctx = npudist.init()
    dev, rank, world = ctx.device, ctx.rank, ctx.world_size
    r: dict = {"device": str(dev), "backend": ctx.backend, "accelerator": ctx.accelerator.name,
               "row": SIM.row, "chip": None}
    from npudist.sim.device import physical_chip

    r["chip"] = physical_chip()
    # FSDP2/DTensor build a DeviceMesh over the group, which reads its name
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(dev.type, (world,))
    r["mesh_group"] = [mesh.get_group().group_name, dist.group.WORLD.group_name]
    r["cpu_tensor"] = refusal(lambda: dist.all_reduce(torch.ones(4)))
    # A wait on a view of a functional all-gather's output waits the collective, as where the view shares the
    # output's storage (FSDP2 waits such views): torch's work registry holds it until then, as on gloo. The default
    # row only: the strict one refuses the output torch allocates, which is not 128-byte aligned.
    if SIM.row == "hccl":
        from torch._C._distributed_c10d import _get_work_registry_size

        gathered = torch.ops._c10d_functional.all_gather_into_tensor(torch.ones(128, device=dev), world,
                                                                     dist.group.WORLD.group_name)
        registered = _get_work_registry_size()
        torch.ops._c10d_functional.wait_tensor(gathered.view(world, 128)[0])
        r["funcol_view_wait"] = [registered, _get_work_registry_size()]
    t = aligned_empty(128, torch.float32, dev, 128).fill_(float(rank + 1))  # meets even the strict row
    dist.all_reduce(t)
    r["raw_sum_ok"] = bool((t.cpu() == sum(range(1, world + 1))).all())
    r["raw_bf16"] = refusal(lambda: dist.all_reduce(torch.ones(128, dtype=torch.bfloat16, device=dev)))
    r["raw_100"] = refusal(lambda: dist.all_reduce(torch.ones(100, device=dev)))
    base = aligned_empty(129, torch.float32, dev, 128).fill_(1.0)
    r["raw_misaligned"] = refusal(lambda: dist.all_reduce(base[1:]))
    r["raw_strided"] = refusal(lambda: dist.all_reduce(torch.ones(256, device=dev)[::2]))
    # ReduceOp.AVG as a fine-tune script averages its bf16 loss; and float32 (aligned, 128 elements: nothing but
    # the op for the strict row to refuse); and an integer tensor, which torch_npu's division cannot take.
    loss = torch.full((128,), float(rank + 1), dtype=torch.bfloat16, device=dev)
    r["raw_bf16_avg"] = refusal(lambda: dist.all_reduce(loss, op=dist.ReduceOp.AVG))
    r["raw_bf16_avg_values"] = sorted(set(loss.cpu().float().tolist()))
    f32 = aligned_empty(128, torch.float32, dev, 128).fill_(float(rank + 1))
    r["raw_f32_avg"] = refusal(lambda: dist.all_reduce(f32, op=dist.ReduceOp.AVG))
    r["raw_f32_avg_values"] = sorted(set(f32.cpu().tolist()))
    r["raw_int_avg"] = refusal(lambda: dist.all_reduce(torch.ones(128, dtype=torch.int64, device=dev),
                                                       op=dist.ReduceOp.AVG))
    # bool and uint8 all-reduces: torch_npu casts them to int32 first (a bool sum is an or; uint8 wraps)
    flags = torch.tensor([rank == 0, False, True], device=dev)
    r["raw_bool_sum"] = refusal(lambda: dist.all_reduce(flags))
    r["raw_bool_values"] = flags.cpu().tolist()
    counts = torch.full((4,), 200, dtype=torch.uint8, device=dev)
    r["raw_uint8_sum"] = refusal(lambda: dist.all_reduce(counts))
    r["raw_uint8_values"] = counts.cpu().tolist()
    r["raw_bool_reduce_scatter"] = refusal(lambda: dist.reduce_scatter_tensor(
        torch.zeros(1, dtype=torch.bool, device=dev), torch.ones(world, dtype=torch.bool, device=dev)))
    b = torch.full((100,), float(rank + 1), dtype=torch.bfloat16, device=dev)
    npudist.all_reduce(b)  # npudist adapts to the active row: cast, pad
    # device type: the tensor is on this rank's device (npu:0 for all without the C++ guard: sim/guard.py)
    r["npudist_bf16_ok"] = b.device.type == dev.type and bool((b.cpu().float() == sum(range(1, world + 1))).all())
    before = SIM.counts.calls["all_reduce"]
    lock = checkpoint.lock_run_dir(str(run_dir))  # broadcasts its outcome
    state = {"w": torch.arange(6.0, device=dev), "step": 3}
    checkpoint.save(state, str(run_dir), 3)  # synchronous: ranks agree on success over the group
    checkpoint.save(state, str(run_dir), 4, async_save=True).wait()
    dist.barrier()  # rank 0 wrote it; the others read it after
    found = checkpoint.load_latest(str(run_dir))
    r["checkpoint_step"] = None if found is None else found[1]
    r["checkpoint_values"] = None if found is None else found[0]["w"].tolist()
    r["control_all_reduces"] = SIM.counts.calls["all_reduce"] - before
    r["calls"] = dict(SIM.counts.calls)
    r["refused"] = dict(SIM.counts.refused)
    r["bytes"] = dict(SIM.counts.bytes)
    npudist.shutdown()
    if lock is not None:
        lock.release()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(r))


if __name__ == "__main__":
    main()
