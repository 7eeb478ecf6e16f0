"""A training script written for torch_npu, with no npudist in it: the idioms of Ascend's own examples.

Run under ``npudist launch --simulate npu`` it trains on the simulated NPU unchanged. It prints one
``RESULT`` line per rank with what the test checks.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch_npu
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
device_id = local_rank if torch.npu.device_count() > local_rank else 0  # one visible chip per process
torch.npu.set_device(device_id)
dist.init_process_group(backend="hccl")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).npu()
model = DDP(model, device_ids=[device_id])
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = x.sum(dim=1, keepdim=True)
losses = []
for _ in range(20):
    shard = slice(dist.get_rank() * 32, (dist.get_rank() + 1) * 32)
    loss = torch.nn.functional.mse_loss(model(x[shard].npu()), y[shard].npu())
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
torch.npu.synchronize()
# One write per line: two ranks share the launcher's stdout, and print() writes the text and its newline
# separately when Python runs unbuffered, so two ranks' lines can interleave.
sys.stdout.write("RESULT " + json.dumps({
    "rank": dist.get_rank(), "device": str(next(model.parameters()).device), "backend": dist.get_backend(),
    "first": losses[0], "last": losses[-1], "torch_npu": torch_npu.__version__,
    "memory_allocated": torch.npu.memory_allocated(),
}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
