"""A DDP training script written the way Ascend's own examples are, with nothing of npudist in it.

Idioms copied from Ascend's public material: ``torch.npu.set_device(rank)`` then ``.npu()`` tensors
(Ascend/pytorch test/distributed/_fault_mode_cases/error_discontinuous_tensor.py), device discovery with
``torch_npu.npu.device_count()`` and ``dist.init_process_group`` with hccl (hicann/hccl
examples/03_ai_framework/01_pytorch/README.md), and the torch_npu DDP pattern ``set_device(local_rank)``,
``device=f"npu:{local_rank}"``, ``DDP(model, device_ids=[local_rank])``, with the object collectives
torch's own DDP recipes use to share settings and results. It must train unchanged under
``npudist launch --simulate npu``; it prints one ``RESULT`` line per rank.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch_npu
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device_count = torch_npu.npu.device_count()
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = f"npu:{local_rank}"

    config = [{"lr": 0.05, "steps": 20, "seed": 0}] if rank == 0 else [None]
    dist.broadcast_object_list(config, src=0)
    config = config[0]

    torch.manual_seed(config["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    per_rank = 64 // world_size
    losses = []
    for _ in range(config["steps"]):
        inputs = x[rank * per_rank:(rank + 1) * per_rank].to(device)
        target = y[rank * per_rank:(rank + 1) * per_rank].to(device)
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    total = torch.ones(128, device=f"npu:{local_rank}")
    dist.all_reduce(total)
    torch.npu.synchronize()

    every = [None] * world_size
    dist.all_gather_object(every, {"rank": rank, "last": losses[-1]})
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(losses[-1], gathered, dst=0)
    mine = [None]
    dist.scatter_object_list(mine, [f"shard-{i}" for i in range(world_size)] if rank == 0 else None, src=0)

    sys.stdout.write("RESULT " + json.dumps({
        "rank": rank, "local_rank": local_rank, "device_count": device_count,
        "current_device": torch.npu.current_device(), "config": config, "first": losses[0], "last": losses[-1],
        "all_reduce": total[0].item(), "all_gather_object": every, "gather_object": gathered,
        "scatter_object_list": mine[0],
        "params": [p.detach().cpu().tolist() for p in model.parameters()][-1],
    }) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
