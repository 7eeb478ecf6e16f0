"""A CUDA DDP training script ported the way Huawei documents: two import lines added, nothing else changed.

The script is a plain torchrun DDP trainer in the style of the PyTorch DDP tutorial (pytorch/examples
distributed/ddp-tutorial-series/multigpu_torchrun.py: ``torch.cuda.set_device(local_rank)``,
``init_process_group(backend="nccl")``, ``.cuda()``/``.to(f"cuda:{gpu_id}")``, ``DDP(model,
device_ids=[gpu_id])``) with the CUDA AMP recipe (``torch.cuda.amp.GradScaler``/``autocast``). The port is
Huawei's automatic migration (Ascend "PyTorch model migration: automatic migration"): ``import torch_npu`` and
``from torch_npu.contrib import transfer_to_npu`` at the top. Prints one ``RESULT`` line per rank.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_npu  # noqa: F401 - the port's first line
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_npu.contrib import transfer_to_npu  # noqa: F401 - the port's second line


@torch.jit.script
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


def refused(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.cuda.amp.GradScaler()

    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = (x[:, :4] * 2).contiguous()
    per = 64 // world
    losses, dtypes = [], set()
    for _ in range(15):
        inputs = x[rank * per:(rank + 1) * per].to(f"cuda:{local_rank}", non_blocking=True)
        target = y[rank * per:(rank + 1) * per].to(device)
        with torch.cuda.amp.autocast():
            out = model(inputs)
            loss = F.mse_loss(out.float(), target)
        dtypes.add(str(out.dtype))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    torch.cuda.synchronize()

    summed = torch.ones(4, device="cuda") * (rank + 1)
    dist.all_reduce(summed)
    params = torch.cat([p.detach().float().flatten() for p in model.parameters()]).cpu()
    sys.stdout.write("RESULT " + json.dumps({
        "rank": rank, "backend": dist.get_backend(), "device": str(next(model.parameters()).device),
        "is_cuda": next(model.parameters()).is_cuda, "on": str(summed.device), "all_reduce": summed.tolist(),
        "autocast_dtypes": sorted(dtypes), "first": losses[0], "last": losses[-1],
        "device_name": torch.cuda.get_device_name(), "jit_scripted": isinstance(scaled, torch.jit.ScriptFunction),
        "params_sum": params.sum().item(), "params_head": params[:4].tolist(),
        "cuda_graph": refused(lambda: torch.cuda.graph_pool_handle()),
    }) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
