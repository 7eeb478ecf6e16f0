"""A multi-card script that never imports torch_npu, in the style of torch_npu's own distributed tests.

torch_npu's tests rely on its ``torch.backends`` entry point loading it at ``import torch``: e.g. Ascend/pytorch
test/distributed/status_save/status_save_simple.py (commit 9e73e708) reads RANK/LOCAL_RANK, makes
``torch.device('npu:{}'.format(local_rank))``, calls ``torch.npu.set_device(device)``, starts
``init_process_group(backend='hccl', rank=rank, world_size=2, timeout=...)`` and all-reduces
``torch.tensor(1).npu()``. This script does the same, then averages a bfloat16 loss with ``ReduceOp.AVG`` (what a
fine-tune script does for its log line) and trains a DDP model. Run by torchrun with NPUDIST_SIMULATE=npu and
nothing on PYTHONPATH but npudist: the simulated NPU must arrive through the entry point alone. Prints one
``RESULT`` line per rank.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ['RANK'])
    local_rank = int(os.environ['LOCAL_RANK'])
    device = torch.device('npu:{}'.format(local_rank))  # noqa: UP032 - the test's own spelling
    torch.npu.set_device(device)

    dist.init_process_group(backend='hccl', rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    tensor = torch.tensor(1).npu()
    dist.all_reduce(tensor)

    loss_log = torch.full((8,), float(rank + 1), dtype=torch.bfloat16).npu()
    dist.all_reduce(loss_log, op=dist.ReduceOp.AVG)

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1).to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)).to(device)
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    dist.barrier()
    sys.stdout.write("RESULT " + json.dumps({
        "rank": rank, "all_reduce": tensor.item(), "avg": loss_log.float().tolist(), "avg_dtype": str(loss_log.dtype),
        "device": str(tensor.device), "accelerator": str(torch.accelerator.current_accelerator()),
        "accelerator_count": torch.accelerator.device_count(), "npu_count": torch.npu.device_count(),
        "current_device": torch.npu.current_device(), "torch_npu_loaded": "torch_npu" in sys.modules,
        "first": losses[0], "last": losses[-1],
    }) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
